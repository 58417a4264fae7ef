"""Hardware presets: the datasheet facts the roofline cost model needs.

Units: memory in GB (1e9 bytes) as vendors print it, bandwidths in GB/s, compute in dense TFLOP/s
(no structured sparsity). For GeForce cards the tensor-core rate is the one with FP32 accumulation,
which is what PyTorch and vLLM kernels use (the FP16-accumulate figure is twice as high).
Host links are theoretical per-direction PCIe rates; the engine preset and `offload.link_gb_s`
decide how much of that a copy achieves. FP8 rates are dense e4m3 tensor-core rates (0: no FP8
tensor cores, as on Ampere and older, where fp8 weights only save bytes).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

# Theoretical per-direction bandwidth of a x16 PCIe link, GB/s (PCI-SIG; 128b/130b encoding).
PCIE_X16_GB_S = {3: 15.75, 4: 31.5, 5: 63.0}
# Links a published collective table may be measured over besides the presets' GPU-to-GPU ones:
# a node's RDMA NIC (ConnectX-7 InfiniBand, 400 Gb/s), which expert-parallel all-to-all kernels use.
NETWORK_LINKS = ("infiniband-400g",)


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
    fp8_tflops: float = 0.0     # dense fp8 (e4m3) tensor-core rate; 0 where there are no fp8 tensor cores
    # How sharply a GEMM turns from weight-bound to compute-bound: time = (compute^p + memory^p)^(1/p)
    # (p = infinity is the roofline's max). Small-M GEMMs near the ridge reach neither peak: their
    # tiles are too few to hide weight loads behind tensor-core work. Set per hardware class from
    # the published catalogue's fit half (docs/validation-published.md); None keeps the plain roofline.
    gemm_corner: float | None = None
    # The name aiconfigurator-core's measured operator tables know this GPU by (sim/cost/operator_tables.py);
    # None where the package measured no such part.
    operator_tables: str | None = None
    # Nodes: GPUs in one server, and GPUs that reach each other over `interconnect` (an HGX board's 8,
    # a GB200 NVL72 rack's 72); beyond that domain GPUs talk over the scale-out network, each GPU at
    # `network_gb_s` per direction (0: none, the part is not deployed across nodes).
    gpus_per_node: int = 8
    nvlink_domain: int = 8
    network_gb_s: float = 50.0

    @property
    def tables_system(self) -> str:
        """The folder measured tables of this GPU are filed under: the package's name for it, else
        the preset's own (a user's tables, sim/formats/operator_layout.py)."""
        return self.operator_tables or self.name

    @property
    def host_link_gb_s(self) -> float:
        """Theoretical per-direction host link bandwidth from generation and width."""
        if self.link_gb_s is not None:
            return self.link_gb_s
        return PCIE_X16_GB_S[self.pcie_gen] * self.pcie_lanes / 16

    def peak_tflops(self, dtype: str) -> float:
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops,
                "fp8": self.fp8_tflops or self.bf16_tflops}[dtype]

    def with_overrides(self, **fields) -> "HardwareSpec":
        return replace(self, **fields)


# GEMM corners (HardwareSpec.gemm_corner), set on the published catalogue's fit half by
# `python -m sim validate --published --fit` (sim/validate/published/fit.py, docs/validation-published.md):
# datacenter parts p = 1 (SGLang on an H100 across batch 2-64, Hugging Face loops on an A100: weight
# streaming and tensor-core work do not overlap at the small M of decode and verification), GeForce
# cards p = 1.25 (vLLM and Hugging Face loops on an RTX 3090). Only H100, A100 and RTX 3090 have fit
# cases, so for B200, MI300X, L40 and the other GeForce cards the class's value is carried over.
DATACENTER_CORNER = 1.0
GEFORCE_CORNER = 1.25

HARDWARE: dict[str, HardwareSpec] = {
    # NVIDIA H100 datasheet (SXM5 80GB): 3.35 TB/s HBM3, 989 TFLOPs dense BF16/FP16, 67 TFLOPs FP32,
    # PCIe Gen5 x16, NVLink 4 900 GB/s total (450 GB/s per direction).
    # Dense FP8: 1,979 TFLOPs.
    "h100-sxm": HardwareSpec("h100-sxm", 80, 3350, 989.4, 989.4, 67.0, 5, 16, 450, "nvlink4", fp8_tflops=1978.9,
                             gemm_corner=DATACENTER_CORNER, operator_tables="h100_sxm"),
    # NVIDIA H100 PCIe 80GB: 2.0 TB/s HBM2e, 756 TFLOPs dense BF16, 51 TFLOPs FP32, PCIe Gen5 x16,
    # optional NVLink bridge 600 GB/s total (300 per direction).
    # Dense FP8: 1,513 TFLOPs.
    "h100-pcie": HardwareSpec("h100-pcie", 80, 2000, 756.0, 756.0, 51.0, 5, 16, 300, "nvlink-bridge",
                              fp8_tflops=1513.0, gemm_corner=DATACENTER_CORNER),
    # NVIDIA H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s, same compute as H100 SXM, NVLink 900 GB/s.
    "h200": HardwareSpec("h200", 141, 4800, 989.4, 989.4, 67.0, 5, 16, 450, "nvlink4", fp8_tflops=1978.9,
                         gemm_corner=DATACENTER_CORNER, operator_tables="h200_sxm"),
    # NVIDIA HGX B200 (per GPU): 180 GB HBM3e at 7.7 TB/s, 2.25 PFLOPs dense BF16, 4.5 PFLOPs dense
    # FP8, 75 TFLOPs FP32, PCIe Gen5 x16, NVLink 5 1.8 TB/s total.
    "b200": HardwareSpec("b200", 180, 7700, 2250.0, 2250.0, 75.0, 5, 16, 900, "nvlink5", fp8_tflops=4500.0,
                         gemm_corner=DATACENTER_CORNER, operator_tables="b200_sxm"),
    # NVIDIA GB200 NVL72 (per GPU, the rack's figures / 72): 186 GB HBM3e at 8 TB/s, 2.5 PFLOPs dense
    # BF16, 5 PFLOPs dense FP8, 80 TFLOPs FP32; NVLink 5 1.8 TB/s total to all 72 GPUs of the rack;
    # NVLink-C2C to its Grace CPU, 900 GB/s total, 480 GB LPDDR5X a Grace (one per 2 GPUs); 4 GPUs a
    # compute tray; one 800 Gb/s ConnectX-8 a GPU to other racks.
    "gb200": HardwareSpec("gb200", 186, 8000, 2500.0, 2500.0, 80.0, 5, 16, 900, "nvlink5", 240.0, link_gb_s=450.0,
                          fp8_tflops=5000.0, gemm_corner=DATACENTER_CORNER, operator_tables="gb200",
                          gpus_per_node=4, nvlink_domain=72, network_gb_s=100.0),
    # AMD Instinct MI300X datasheet: 192 GB HBM3 at 5.3 TB/s, 1,307 TFLOPs dense BF16/FP16, 2,615
    # dense FP8, 163 TFLOPs FP32 matrix, PCIe Gen5 x16, Infinity Fabric 7 links x 64 GB/s per direction.
    "mi300x": HardwareSpec("mi300x", 192, 5300, 1307.4, 1307.4, 163.4, 5, 16, 448, "infinity-fabric",
                           fp8_tflops=2614.9, gemm_corner=DATACENTER_CORNER),
    # NVIDIA A100 datasheet (SXM4 80GB): 2,039 GB/s HBM2e, 312 TFLOPs BF16/FP16, 19.5 TFLOPs FP32,
    # PCIe Gen4 x16, NVLink 3 600 GB/s total.
    "a100-80g": HardwareSpec("a100-80g", 80, 2039, 312.0, 312.0, 19.5, 4, 16, 300, "nvlink3",
                             gemm_corner=DATACENTER_CORNER, operator_tables="a100_sxm", network_gb_s=25.0),
    # NVIDIA A100 40GB (SXM4): 1,555 GB/s HBM2.
    "a100-40g": HardwareSpec("a100-40g", 40, 1555, 312.0, 312.0, 19.5, 4, 16, 300, "nvlink3", gemm_corner=DATACENTER_CORNER,
                             network_gb_s=25.0),
    # NVIDIA L40 datasheet: 48 GB GDDR6 at 864 GB/s, 181 TFLOPs dense BF16/FP16 (362 sparse),
    # 90.5 TFLOPs FP32, PCIe Gen4 x16, no NVLink (TP goes over PCIe).
    "l40": HardwareSpec("l40", 48, 864, 181.0, 181.0, 90.5, 4, 16, 31.5 * 0.8, "pcie4", 256, fp8_tflops=362.0,
                        gemm_corner=DATACENTER_CORNER, network_gb_s=0.0),
    # RTX 4090 (Ada whitepaper): 24 GB GDDR6X at 1,008 GB/s, 165.2 TFLOPs FP16/BF16 with FP32
    # accumulate, 82.6 TFLOPs FP32, PCIe Gen4 x16, no NVLink.
    # FP8 with FP32 accumulate: 330.3 TFLOPs dense.
    "rtx-4090": HardwareSpec("rtx-4090", 24, 1008, 165.2, 165.2, 82.6, 4, 16, 31.5 * 0.8, "pcie4", 64,
                             fp8_tflops=330.3, gemm_corner=GEFORCE_CORNER, network_gb_s=0.0),
    # RTX 3090 (Ampere GA102 whitepaper): 24 GB GDDR6X at 936 GB/s, 71 TFLOPs FP16/BF16 with FP32
    # accumulate, 35.6 TFLOPs FP32, PCIe Gen4 x16, NVLink 3 bridge 112.5 GB/s total.
    "rtx-3090": HardwareSpec("rtx-3090", 24, 936, 71.0, 71.0, 35.6, 4, 16, 56.25, "nvlink-bridge", 64,
                             gemm_corner=GEFORCE_CORNER, network_gb_s=0.0),
    # RTX 4070: 12 GB GDDR6X at 504 GB/s, 29.1 TFLOPs FP32, PCIe Gen4 x16 (NVIDIA spec page). Tensor
    # rate derived from the Ada whitepaper's per-core rate: 184 cores x 256 FMA/clk/2 x 2.475 GHz
    # = 58.3 TFLOPs FP16/BF16 with FP32 accumulate (the 4060 Ti below is derived the same way).
    "rtx-4070": HardwareSpec("rtx-4070", 12, 504, 58.3, 58.3, 29.1, 4, 16, 31.5 * 0.8, "pcie4", 32, gemm_corner=GEFORCE_CORNER, network_gb_s=0.0),
    # RTX 4060 Ti 8GB: 8 GB GDDR6 at 288 GB/s, 44.1 TFLOPs FP16/BF16 FP32-accumulate, 22.1 TFLOPs
    # FP32, PCIe Gen4 x8 (the card has only eight lanes).
    "rtx-4060-ti-8g": HardwareSpec("rtx-4060-ti-8g", 8, 288, 44.1, 44.1, 22.1, 4, 8, 15.75 * 0.8, "pcie4-x8", 32, gemm_corner=GEFORCE_CORNER, network_gb_s=0.0),
    # RTX 2080 Ti (Turing whitepaper): 11 GB GDDR6 at 616 GB/s, 53.8 TFLOPs FP16 with FP32
    # accumulate, 13.4 TFLOPs FP32; Turing has no BF16 tensor cores, so bf16 runs at the FP32 rate.
    # PCIe Gen3 x16, NVLink 2 bridge 100 GB/s total.
    "rtx-2080-ti": HardwareSpec("rtx-2080-ti", 11, 616, 13.4, 53.8, 13.4, 3, 16, 50, "nvlink-bridge", 32, gemm_corner=GEFORCE_CORNER, network_gb_s=0.0),
    # This project's CI machine class: 2 cores of an AMD EPYC (Zen 3, AVX2 + FMA) in a VM, 24 GiB.
    # Measured here: numpy streaming read 15.5 GB/s, copy 19.9 GB/s (read + write); fp32 SGEMM
    # 144 GFLOP/s on 1024^2. No bf16/fp16 matrix units: those dtypes run at about the fp32 rate.
    # There is no host link: "offloading" is a no-op, so the link is set to memory bandwidth.
    "cpu": HardwareSpec("cpu", 24 * 1.073741824, 15.5, 0.144, 0.144, 0.144, 4, 16, 15.5, "none", 24,
                        link_gb_s=15.5, gpus_per_node=1, nvlink_domain=1, network_gb_s=0.0),
}


def preset_of_device(device_name: str) -> str:
    """The hardware preset a device's name (torch.cuda.get_device_name, or "cpu") corresponds to;
    "custom" where none does."""
    name = device_name.lower()
    if name == "cpu":
        return "cpu"
    # Parts without a preset of their own (L40S, H100 NVL) come before the names they contain.
    for needle, preset in (("h200", "h200"), ("h100 nvl", "custom"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"),
                           ("b200", "b200"), ("mi300x", "mi300x"), ("a100-sxm4-40", "a100-40g"),
                           ("a100-pcie-40", "a100-40g"), ("a100", "a100-80g"), ("l40s", "custom"), ("l40", "l40"),
                           ("4090", "rtx-4090"), ("3090", "rtx-3090"), ("4070", "rtx-4070"),
                           ("4060 ti", "rtx-4060-ti-8g"), ("2080 ti", "rtx-2080-ti")):
        if needle in name:
            return preset
    return "custom"
