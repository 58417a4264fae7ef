"""Math only: Triton kernels for attention (decode, chain and tree verification, partial KV), block
selection and weight-only quantized matmul, each with a torch reference (issue 4 builds them)."""
