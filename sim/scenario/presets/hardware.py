"""Hardware presets: the datasheet facts the roofline cost model needs.

Units: memory in GB (1e9 bytes) as vendors print it, bandwidths in GB/s, compute in dense TFLOP/s
(no structured sparsity). For GeForce cards the tensor-core rate is the one with FP32 accumulation,
which is what PyTorch and vLLM kernels use (the FP16-accumulate figure is twice as high).
Host links are theoretical per-direction PCIe rates; the engine preset and `offload.link_gb_s`
decide how much of that a copy achieves.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

# Theoretical per-direction bandwidth of a x16 PCIe link, GB/s (PCI-SIG; 128b/130b encoding).
PCIE_X16_GB_S = {3: 15.75, 4: 31.5, 5: 63.0}


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    memory_gb: float            # device memory
    hbm_gb_s: float             # device memory bandwidth
    bf16_tflops: float          # dense bf16 tensor-core rate
    fp16_tflops: float          # dense fp16 tensor-core rate (fp32 accumulate)
    fp32_tflops: float          # non-tensor fp32 rate (what an fp32 matmul gets without TF32)
    pcie_gen: int               # host link generation
    pcie_lanes: int             # host link width
    interconnect_gb_s: float    # per-direction GPU-to-GPU bandwidth for tensor parallelism
    interconnect: str           # what that link is
    host_memory_gb: float = 512.0  # host RAM available for offloaded weights and KV
    link_gb_s: float | None = None  # set only where the host link is not a PCIe slot

    @property
    def host_link_gb_s(self) -> float:
        """Theoretical per-direction host link bandwidth from generation and width."""
        if self.link_gb_s is not None:
            return self.link_gb_s
        return PCIE_X16_GB_S[self.pcie_gen] * self.pcie_lanes / 16

    def peak_tflops(self, dtype: str) -> float:
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops}[dtype]

    def with_overrides(self, **fields) -> "HardwareSpec":
        return replace(self, **fields)


HARDWARE: dict[str, HardwareSpec] = {
    # NVIDIA H100 datasheet (SXM5 80GB): 3.35 TB/s HBM3, 989 TFLOPs dense BF16/FP16, 67 TFLOPs FP32,
    # PCIe Gen5 x16, NVLink 4 900 GB/s total (450 GB/s per direction).
    "h100-sxm": HardwareSpec("h100-sxm", 80, 3350, 989.4, 989.4, 67.0, 5, 16, 450, "nvlink4"),
    # NVIDIA H100 PCIe 80GB: 2.0 TB/s HBM2e, 756 TFLOPs dense BF16, 51 TFLOPs FP32, PCIe Gen5 x16,
    # optional NVLink bridge 600 GB/s total (300 per direction).
    "h100-pcie": HardwareSpec("h100-pcie", 80, 2000, 756.0, 756.0, 51.0, 5, 16, 300, "nvlink-bridge"),
    # NVIDIA H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s, same compute as H100 SXM, NVLink 900 GB/s.
    "h200": HardwareSpec("h200", 141, 4800, 989.4, 989.4, 67.0, 5, 16, 450, "nvlink4"),
    # NVIDIA A100 datasheet (SXM4 80GB): 2,039 GB/s HBM2e, 312 TFLOPs BF16/FP16, 19.5 TFLOPs FP32,
    # PCIe Gen4 x16, NVLink 3 600 GB/s total.
    "a100-80g": HardwareSpec("a100-80g", 80, 2039, 312.0, 312.0, 19.5, 4, 16, 300, "nvlink3"),
    # NVIDIA A100 40GB (SXM4): 1,555 GB/s HBM2.
    "a100-40g": HardwareSpec("a100-40g", 40, 1555, 312.0, 312.0, 19.5, 4, 16, 300, "nvlink3"),
    # NVIDIA L40 datasheet: 48 GB GDDR6 at 864 GB/s, 181 TFLOPs dense BF16/FP16 (362 sparse),
    # 90.5 TFLOPs FP32, PCIe Gen4 x16, no NVLink (TP goes over PCIe).
    "l40": HardwareSpec("l40", 48, 864, 181.0, 181.0, 90.5, 4, 16, 31.5 * 0.8, "pcie4", 256),
    # RTX 4090 (Ada whitepaper): 24 GB GDDR6X at 1,008 GB/s, 165.2 TFLOPs FP16/BF16 with FP32
    # accumulate, 82.6 TFLOPs FP32, PCIe Gen4 x16, no NVLink.
    "rtx-4090": HardwareSpec("rtx-4090", 24, 1008, 165.2, 165.2, 82.6, 4, 16, 31.5 * 0.8, "pcie4", 64),
    # RTX 3090 (Ampere GA102 whitepaper): 24 GB GDDR6X at 936 GB/s, 71 TFLOPs FP16/BF16 with FP32
    # accumulate, 35.6 TFLOPs FP32, PCIe Gen4 x16, NVLink 3 bridge 112.5 GB/s total.
    "rtx-3090": HardwareSpec("rtx-3090", 24, 936, 71.0, 71.0, 35.6, 4, 16, 56.25, "nvlink-bridge", 64),
    # RTX 4070: 12 GB GDDR6X at 504 GB/s, 29.1 TFLOPs FP32, PCIe Gen4 x16 (NVIDIA spec page). Tensor
    # rate derived from the Ada whitepaper's per-core rate: 184 cores x 256 FMA/clk/2 x 2.475 GHz
    # = 58.3 TFLOPs FP16/BF16 with FP32 accumulate (the 4060 Ti below is derived the same way).
    "rtx-4070": HardwareSpec("rtx-4070", 12, 504, 58.3, 58.3, 29.1, 4, 16, 31.5 * 0.8, "pcie4", 32),
    # RTX 4060 Ti 8GB: 8 GB GDDR6 at 288 GB/s, 44.1 TFLOPs FP16/BF16 FP32-accumulate, 22.1 TFLOPs
    # FP32, PCIe Gen4 x8 (the card has only eight lanes).
    "rtx-4060-ti-8g": HardwareSpec("rtx-4060-ti-8g", 8, 288, 44.1, 44.1, 22.1, 4, 8, 15.75 * 0.8, "pcie4-x8", 32),
    # RTX 2080 Ti (Turing whitepaper): 11 GB GDDR6 at 616 GB/s, 53.8 TFLOPs FP16 with FP32
    # accumulate, 13.4 TFLOPs FP32; Turing has no BF16 tensor cores, so bf16 runs at the FP32 rate.
    # PCIe Gen3 x16, NVLink 2 bridge 100 GB/s total.
    "rtx-2080-ti": HardwareSpec("rtx-2080-ti", 11, 616, 13.4, 53.8, 13.4, 3, 16, 50, "nvlink-bridge", 32),
    # This project's CI machine class: 2 cores of an AMD EPYC (Zen 3, AVX2 + FMA) in a VM, 24 GiB.
    # Measured here: numpy streaming read 15.5 GB/s, copy 19.9 GB/s (read + write); fp32 SGEMM
    # 144 GFLOP/s on 1024^2. No bf16/fp16 matrix units: those dtypes run at about the fp32 rate.
    # There is no host link: "offloading" is a no-op, so the link is set to memory bandwidth.
    "cpu": HardwareSpec("cpu", 24 * 1.073741824, 15.5, 0.144, 0.144, 0.144, 4, 16, 15.5, "none", 24,
                        link_gb_s=15.5),
}
