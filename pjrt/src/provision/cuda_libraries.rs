//! The libraries and tools the CUDA plugins need, each pinned to one wheel (version, file, sha256, size), and
//! the sonames and directories each wheel provides: the CUDA rows of [`super::targets`] take their `libraries`
//! and `cuda_tools` from here.
//!
//! CUDA 13: exactly the versions `torch==2.11.0` pins, i.e. those installed beside `jax[cuda13]` 0.11.2 on the
//! GPU machine the 0.11.2 row was verified on, plus `nvidia-cuda-nvcc` and `nvidia-nvvm` 13.0.88 (`ptxas` and
//! libdevice, the 13.0 release of the others). CUDA 12: the newest 12.x of each. Both sets satisfy the
//! `Requires-Dist` bounds of `jax-cuda13-plugin[with-cuda]` / `jax-cuda12-plugin[with-cuda]`, 0.11.2 and
//! 0.12.0.1 alike (the bounds did not change between them). Each sha256 and size was read from the file
//! downloaded with `pip download --no-deps` and matches PyPI's record; the sonames and directories were read from
//! the wheels.

use super::targets::{Library, LibraryWheel};

/// The driver: no wheel carries it.
const DRIVER: Library = Library {
    soname: "libcuda.so.1",
    wheel: None,
    pinned: None,
    dir: "",
    needed: false,
    system: "the NVIDIA driver (e.g. the libnvidia-compute package); only a machine with an NVIDIA GPU has it",
};

const fn nvidia(soname: &'static str, wheel: &'static LibraryWheel, dir: &'static str) -> Library {
    Library {
        soname,
        wheel: Some(wheel.requirement),
        pinned: Some(wheel),
        dir,
        needed: false,
        system: "the CUDA toolkit (/usr/local/cuda/lib64)",
    }
}

/// What the CUDA 13 plugin opens at run time, in the order jax's own loader opens them (dependencies first).
pub(super) const CUDA13_LIBRARIES: &[Library] = &[
    DRIVER,
    nvidia("libcudart.so.13", &CUDA13_CUDA_RUNTIME, "nvidia/cu13/lib"),
    nvidia("libnvJitLink.so.13", &CUDA13_NVJITLINK, "nvidia/cu13/lib"),
    nvidia("libnvrtc.so.13", &CUDA13_CUDA_NVRTC, "nvidia/cu13/lib"),
    nvidia("libcublasLt.so.13", &CUDA13_CUBLAS, "nvidia/cu13/lib"),
    nvidia("libcublas.so.13", &CUDA13_CUBLAS, "nvidia/cu13/lib"),
    nvidia("libnccl.so.2", &CUDA13_NCCL, "nvidia/nccl/lib"),
    nvidia("libcupti.so.13", &CUDA13_CUDA_CUPTI, "nvidia/cu13/lib"),
    nvidia("libcusparse.so.12", &CUDA13_CUSPARSE, "nvidia/cu13/lib"),
    nvidia("libcusolver.so.12", &CUDA13_CUSOLVER, "nvidia/cu13/lib"),
    nvidia("libcufft.so.12", &CUDA13_CUFFT, "nvidia/cu13/lib"),
    nvidia("libnvshmem_host.so.3", &CUDA13_NVSHMEM, "nvidia/nvshmem/lib"),
    nvidia("libcudnn.so.9", &CUDA13_CUDNN, "nvidia/cudnn/lib"),
];

/// What XLA compiles CUDA 13 kernels with: `nvidia/cu13/bin/ptxas` and `nvidia/cu13/nvvm/libdevice/`.
pub(super) const CUDA13_TOOLS: &[LibraryWheel] = &[CUDA13_CUDA_NVCC, CUDA13_NVVM];

/// As [`CUDA13_LIBRARIES`], for the CUDA 12 plugins.
pub(super) const CUDA12_LIBRARIES: &[Library] = &[
    DRIVER,
    nvidia("libcudart.so.12", &CUDA12_CUDA_RUNTIME, "nvidia/cuda_runtime/lib"),
    nvidia("libnvJitLink.so.12", &CUDA12_NVJITLINK, "nvidia/nvjitlink/lib"),
    nvidia("libnvrtc.so.12", &CUDA12_CUDA_NVRTC, "nvidia/cuda_nvrtc/lib"),
    nvidia("libcublasLt.so.12", &CUDA12_CUBLAS, "nvidia/cublas/lib"),
    nvidia("libcublas.so.12", &CUDA12_CUBLAS, "nvidia/cublas/lib"),
    nvidia("libnccl.so.2", &CUDA12_NCCL, "nvidia/nccl/lib"),
    nvidia("libcupti.so.12", &CUDA12_CUDA_CUPTI, "nvidia/cuda_cupti/lib"),
    nvidia("libcusparse.so.12", &CUDA12_CUSPARSE, "nvidia/cusparse/lib"),
    nvidia("libcusolver.so.11", &CUDA12_CUSOLVER, "nvidia/cusolver/lib"),
    nvidia("libcufft.so.11", &CUDA12_CUFFT, "nvidia/cufft/lib"),
    nvidia("libnvshmem_host.so.3", &CUDA12_NVSHMEM, "nvidia/nvshmem/lib"),
    nvidia("libcudnn.so.9", &CUDA12_CUDNN, "nvidia/cudnn/lib"),
];

/// `nvidia/cuda_nvcc/bin/ptxas` and `nvidia/cuda_nvcc/nvvm/libdevice/` (CUDA 12 ships both in one wheel).
pub(super) const CUDA12_TOOLS: &[LibraryWheel] = &[CUDA12_CUDA_NVCC];

const CUDA13_CUBLAS: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cublas==13.1.0.3",
    file: "nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171",
    bytes: 423_133_236,
};
const CUDA13_CUDA_CUPTI: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cuda-cupti==13.0.85",
    file: "nvidia_cuda_cupti-13.0.85-py3-none-manylinux_2_25_x86_64.whl",
    sha256: "4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8",
    bytes: 10_715_597,
};
const CUDA13_CUDA_NVCC: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cuda-nvcc==13.0.88",
    file: "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
    bytes: 37_384_532,
};
const CUDA13_CUDA_NVRTC: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cuda-nvrtc==13.0.88",
    file: "nvidia_cuda_nvrtc-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575",
    bytes: 90_215_200,
};
const CUDA13_CUDA_RUNTIME: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cuda-runtime==13.0.96",
    file: "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
    bytes: 2_243_632,
};
const CUDA13_CUDNN: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cudnn-cu13==9.19.0.56",
    file: "nvidia_cudnn_cu13-9.19.0.56-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "d20e1734305e9d68889a96e3f35094d733ff1f83932ebe462753973e53a572bf",
    bytes: 366_066_321,
};
const CUDA13_CUFFT: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cufft==12.0.0.61",
    file: "nvidia_cufft-12.0.0.61-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "6c44f692dce8fd5ffd3e3df134b6cdb9c2f72d99cf40b62c32dde45eea9ddad3",
    bytes: 214_085_489,
};
const CUDA13_CUSOLVER: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cusolver==12.0.4.66",
    file: "nvidia_cusolver-12.0.4.66-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "0a759da5dea5c0ea10fd307de75cdeb59e7ea4fcb8add0924859b944babf1112",
    bytes: 200_941_980,
};
const CUDA13_CUSPARSE: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cusparse==12.6.3.3",
    file: "nvidia_cusparse-12.6.3.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "2b3c89c88d01ee0e477cb7f82ef60a11a4bcd57b6b87c33f789350b59759360b",
    bytes: 145_942_937,
};
const CUDA13_NCCL: LibraryWheel = LibraryWheel {
    requirement: "nvidia-nccl-cu13==2.28.9",
    file: "nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_x86_64.whl",
    sha256: "e4553a30f34195f3fa1da02a6da3d6337d28f2003943aa0a3d247bbc25fefc42",
    bytes: 196_493_177,
};
const CUDA13_NVJITLINK: LibraryWheel = LibraryWheel {
    requirement: "nvidia-nvjitlink==13.0.88",
    file: "nvidia_nvjitlink-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "13a74f429e23b921c1109976abefacc69835f2f433ebd323d3946e11d804e47b",
    bytes: 40_713_933,
};
const CUDA13_NVSHMEM: LibraryWheel = LibraryWheel {
    requirement: "nvidia-nvshmem-cu13==3.4.5",
    file: "nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "290f0a2ee94c9f3687a02502f3b9299a9f9fe826e6d0287ee18482e78d495b80",
    bytes: 60_412_546,
};
const CUDA13_NVVM: LibraryWheel = LibraryWheel {
    requirement: "nvidia-nvvm==13.0.88",
    file: "nvidia_nvvm-13.0.88-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
    bytes: 61_601_415,
};
const CUDA12_CUBLAS: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cublas-cu12==12.9.3.13",
    file: "nvidia_cublas_cu12-12.9.3.13-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "d7d51055f161b317c7105ddaae90e71eda059026074ffef93cf7cde2886bfe72",
    bytes: 581_217_458,
};
const CUDA12_CUDA_CUPTI: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cuda-cupti-cu12==12.9.79",
    file: "nvidia_cuda_cupti_cu12-12.9.79-py3-none-manylinux_2_25_x86_64.whl",
    sha256: "096bcf334f13e1984ba36685ad4c1d6347db214de03dbb6eebb237b41d9d934f",
    bytes: 10_814_997,
};
const CUDA12_CUDA_NVCC: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cuda-nvcc-cu12==12.9.86",
    file: "nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0",
    bytes: 40_546_229,
};
const CUDA12_CUDA_NVRTC: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cuda-nvrtc-cu12==12.9.86",
    file: "nvidia_cuda_nvrtc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4",
    bytes: 89_568_129,
};
const CUDA12_CUDA_RUNTIME: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cuda-runtime-cu12==12.9.79",
    file: "nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3",
    bytes: 3_493_179,
};
const CUDA12_CUDNN: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cudnn-cu12==9.28.0.42",
    file: "nvidia_cudnn_cu12-9.28.0.42-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "9ff58b7f36dacd0a93e89f8f2957b52466889217963701daa15e577317cfa375",
    bytes: 716_538_495,
};
const CUDA12_CUFFT: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cufft-cu12==11.4.1.4",
    file: "nvidia_cufft_cu12-11.4.1.4-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "c67884f2a7d276b4b80eb56a79322a95df592ae5e765cf1243693365ccab4e28",
    bytes: 200_877_592,
};
const CUDA12_CUSOLVER: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cusolver-cu12==11.7.5.82",
    file: "nvidia_cusolver_cu12-11.7.5.82-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "15da72d1340d29b5b3cf3fd100e3cd53421dde36002eda6ed93811af63c40d88",
    bytes: 338_117_415,
};
const CUDA12_CUSPARSE: LibraryWheel = LibraryWheel {
    requirement: "nvidia-cusparse-cu12==12.5.10.65",
    file: "nvidia_cusparse_cu12-12.5.10.65-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "73060ce019ac064a057267c585bf1fd5a353734151f87472ff02b2c5c9984e78",
    bytes: 366_465_088,
};
const CUDA12_NCCL: LibraryWheel = LibraryWheel {
    requirement: "nvidia-nccl-cu12==2.32.3",
    file: "nvidia_nccl_cu12-2.32.3-py3-none-manylinux_2_27_x86_64.whl",
    sha256: "bb94b2348e4861d5e8aa00b36c3d12d9bdf9c6369b82cbb723de0b582280a21c",
    bytes: 351_526_311,
};
const CUDA12_NVJITLINK: LibraryWheel = LibraryWheel {
    requirement: "nvidia-nvjitlink-cu12==12.9.86",
    file: "nvidia_nvjitlink_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "e3f1171dbdc83c5932a45f0f4c99180a70de9bd2718c1ab77d14104f6d7147f9",
    bytes: 39_748_338,
};
const CUDA12_NVSHMEM: LibraryWheel = LibraryWheel {
    requirement: "nvidia-nvshmem-cu12==3.8.0",
    file: "nvidia_nvshmem_cu12-3.8.0-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    sha256: "b2e5760d6158aefe7bb74348d5128bb1b46a7dd1fd4b7b1e6fe55b4b07888f70",
    bytes: 280_800_183,
};
