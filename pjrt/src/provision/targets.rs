//! Every PJRT target lazuli knows, in one table: the PyPI wheel that carries its plugin (pinned by version and
//! sha256), the plugin's place inside, the libraries it needs beyond the C runtime and where they come from, the
//! client create options it takes, and the PJRT C API versions lazuli accepts from it.
//!
//! The sha256 values, sizes and API versions were read from the wheels themselves (downloaded with
//! `pip download --no-deps`, hashed, unpacked and loaded on x86-64 Linux); `pjrt/tests/targets.rs` checks them
//! again. The libraries are the plugin's `DT_NEEDED` entries (read with [`super::elf`]) and, for CUDA, the ones
//! the plugin opens at run time (jax's own loader lists the same); the wheels that provide them are those the
//! matching `jax-*-plugin` package requires. CUDA's are pinned too, each to one wheel file and sha256
//! (`cuda_libraries.rs`), and fetched like the plugin when found nowhere.

use super::cuda_libraries::{CUDA12_LIBRARIES, CUDA12_TOOLS, CUDA13_LIBRARIES, CUDA13_TOOLS};
use super::PluginSpec;

/// What a target runs on; [`Device::setting`] is its `LAZULI_DEVICE` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    /// NVIDIA GPUs.
    Cuda,
    Tpu,
    /// AMD GPUs.
    Rocm,
    /// Intel GPUs (oneAPI / SYCL).
    Xpu,
    /// Apple GPUs (macOS only).
    Metal,
}

impl Device {
    pub const ALL: [Device; 6] = [Device::Cpu, Device::Cuda, Device::Tpu, Device::Rocm, Device::Xpu, Device::Metal];

    /// The value of `LAZULI_DEVICE` that selects it.
    pub fn setting(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "gpu",
            Device::Tpu => "tpu",
            Device::Rocm => "rocm",
            Device::Xpu => "xpu",
            Device::Metal => "metal",
        }
    }

    /// `LAZULI_DEVICE`'s value (`cuda` is also accepted for NVIDIA GPUs).
    pub fn from_setting(value: &str) -> Option<Device> {
        match value {
            "cuda" => Some(Device::Cuda),
            other => Self::ALL.into_iter().find(|d| d.setting() == other),
        }
    }

    /// For messages: "PJRT {name} plugin".
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "CPU",
            Device::Cuda => "CUDA",
            Device::Tpu => "TPU",
            Device::Rocm => "ROCm",
            Device::Xpu => "Intel GPU (oneAPI)",
            Device::Metal => "Metal",
        }
    }

    /// The variable that names the plugin file directly.
    pub fn plugin_variable(self) -> &'static str {
        match self {
            Device::Cpu => "LAZULI_PJRT_PLUGIN",
            Device::Cuda => "LAZULI_GPU_PLUGIN",
            Device::Tpu => "LAZULI_TPU_PLUGIN",
            Device::Rocm => "LAZULI_ROCM_PLUGIN",
            Device::Xpu => "LAZULI_XPU_PLUGIN",
            Device::Metal => "LAZULI_METAL_PLUGIN",
        }
    }
}

/// A library a plugin needs beyond the C and C++ runtimes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Library {
    /// The name the plugin asks the loader for.
    pub soname: &'static str,
    /// The pip requirement whose wheel carries it, or `None` where only the system provides it.
    pub wheel: Option<&'static str>,
    /// That wheel pinned (CUDA's): lazuli fetches it when the library is found nowhere.
    pub pinned: Option<&'static LibraryWheel>,
    /// Its directory inside site-packages (and inside that wheel), e.g. `nvidia/cu13/lib`.
    pub dir: &'static str,
    /// `true`: a `DT_NEEDED` entry, so `dlopen` of the plugin fails without it. `false`: opened by the plugin at
    /// run time (client creation fails, or a feature is missing, without it).
    pub needed: bool,
    /// Where it comes from otherwise (a system package, a driver).
    pub system: &'static str,
}

/// A wheel that carries libraries or tools a plugin needs, pinned like the plugin's own wheel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibraryWheel {
    /// `name==version`, as pip takes it.
    pub requirement: &'static str,
    pub file: &'static str,
    pub sha256: &'static str,
    /// The file's size in bytes.
    pub bytes: u64,
}

impl LibraryWheel {
    pub fn name(&self) -> &'static str {
        self.requirement.split("==").next().unwrap_or(self.requirement)
    }

    pub fn version(&self) -> &'static str {
        self.requirement.split("==").nth(1).unwrap_or("")
    }

    /// Its size in MB, for messages.
    pub fn megabytes(&self) -> u64 {
        self.bytes.div_ceil(1_000_000)
    }

    /// `--platform` arguments naming the file's own platform tags (NVIDIA's wheels carry older and differing
    /// manylinux tags, and pip matches only the tags named), so that `pip download` picks exactly this file.
    pub fn pip_args(&self) -> Vec<String> {
        let tags = self.file.strip_suffix(".whl").and_then(|stem| stem.rsplit('-').next()).unwrap_or("");
        tags.split('.').flat_map(|tag| ["--platform".to_string(), tag.to_string()]).collect()
    }
}

/// Where a target's plugin can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    LinuxX86_64,
    /// A macOS-only wheel: listed, not provisioned; the text says what running it would need.
    MacOsArm64(&'static str),
}

/// One row of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The row's name: `LAZULI_TARGET` picks it.
    pub name: &'static str,
    pub device: Device,
    pub host: Host,
    /// The wheel and the plugin inside it, pinned.
    pub plugin: PluginSpec,
    /// Where `pip install` puts the plugin, relative to site-packages (an installed copy is used first).
    pub installed_as: &'static str,
    /// What `PJRT_Client_PlatformName` returns.
    pub platform: &'static str,
    /// The pinned plugin's PJRT C API version as read from it; `None` where it cannot be loaded here.
    pub api_version: Option<(i32, i32)>,
    /// The PJRT C API versions lazuli accepts from this target's plugins (inclusive).
    pub accepts: ((i32, i32), (i32, i32)),
    pub libraries: &'static [Library],
    /// Client create options the plugin documents: (name, value type).
    pub create_options: &'static [(&'static str, &'static str)],
    /// Where, relative to site-packages, the CUDA tools XLA compiles with lie (`bin/ptxas`, `nvvm/libdevice`):
    /// XLA's `xla_gpu_cuda_data_dir`. Empty for other devices.
    pub cuda_data_dir: &'static str,
    /// The pinned wheels that put those tools into `cuda_data_dir`.
    pub cuda_tools: &'static [LibraryWheel],
    /// Where under `<cache>/libs/` the pinned wheels of `libraries` and `cuda_tools` are unpacked, laid out as pip
    /// lays them out in site-packages; rows pinning the same wheels share it. Empty where nothing is pinned.
    pub library_dir: &'static str,
}

/// The oldest C API whose struct layouts lazuli's bindings use (see `ffi::MIN_API_VERSION`), and the newest
/// version seen working.
const ACCEPTED: ((i32, i32), (i32, i32)) = ((0, 57), (0, 117));

const CPU_OPTIONS: &[(&str, &str)] =
    &[("cpu_device_count", "int64"), ("asynchronous", "bool"), ("process_id", "int64"), ("collectives", "")];
/// The GPU plugins' options (jax's `generate_pjrt_gpu_plugin_options` and XLA's GPU client).
const GPU_OPTIONS: &[(&str, &str)] = &[
    ("platform_name", "string"),
    ("allocator", "string: default, platform, bfc, cuda_async"),
    ("memory_fraction", "float"),
    ("preallocate", "bool"),
    ("collective_memory_size", "int64"),
    ("visible_devices", "int64 list"),
    ("node_id", "int64"),
    ("num_nodes", "int64"),
    ("enable_mock_nccl", "bool"),
    ("mock_gpu_topology", "string"),
];

const fn needs(soname: &'static str, wheel: &'static str, dir: &'static str, system: &'static str) -> Library {
    Library { soname, wheel: Some(wheel), pinned: None, dir, needed: true, system }
}

/// The ROCm plugin's `DT_NEEDED` entries beyond the C runtime; the wheels are those
/// `jax-rocm7-plugin[with-rocm]` requires, else a ROCm 7 installation in /opt/rocm/lib.
const ROCM_LIBRARIES: &[Library] = &[
    needs("librocprofiler-sdk.so.1", "amd_rocm_hip_runtime_instinct", "_rocm_sdk_core/lib", "ROCm 7 (/opt/rocm/lib)"),
    needs("librccl.so.1", "amd_rccl_instinct", "_rocm_sdk_libraries/lib", "ROCm 7 (rccl)"),
    needs("libhsa-runtime64.so.1", "amd_rocm_hip_runtime_instinct", "_rocm_sdk_core/lib", "ROCm 7 (hsa-rocr)"),
    needs("librocm_sysdeps_drm.so.2", "amd_rocm_hip_runtime_instinct", "_rocm_sdk_core/lib", "ROCm 7 (TheRock)"),
    needs("librocm_sysdeps_drm_amdgpu.so.1", "amd_rocm_hip_runtime_instinct", "_rocm_sdk_core/lib", "ROCm 7"),
    needs("librocm_sysdeps_numa.so.1", "amd_rocm_hip_runtime_instinct", "_rocm_sdk_core/lib", "ROCm 7 (TheRock)"),
    needs("libhipblaslt.so.1", "amd_hipblas_instinct", "_rocm_sdk_libraries/lib", "ROCm 7 (hipblaslt)"),
    needs("libhipfft.so.0", "amd_hipfft_instinct", "_rocm_sdk_libraries/lib", "ROCm 7 (hipfft)"),
    needs("libMIOpen.so.1", "amd_miopen_hip_instinct", "_rocm_sdk_libraries/lib", "ROCm 7 (miopen-hip)"),
    needs("librocblas.so.5", "amd_hipblas_instinct", "_rocm_sdk_libraries/lib", "ROCm 7 (rocblas)"),
    needs("libamd_smi.so.26", "amd_rocm_hip_runtime_instinct", "_rocm_sdk_core/lib", "ROCm 7 (amd-smi-lib)"),
    needs("libamdhip64.so.7", "amd_rocm_hip_runtime_instinct", "_rocm_sdk_core/lib", "ROCm 7 (hip-runtime-amd)"),
];

/// The oneAPI plugin's `DT_NEEDED` entries beyond the C runtime; the wheels are those
/// `jax-oneapi-plugin[with-oneapi]` requires (pinned exactly there), else an oneAPI 2025.1 installation.
const ONEAPI_LIBRARIES: &[Library] = &[
    needs("libmpi.so.12", "impi-rt==2021.15.0", "../..", "Intel MPI"),
    needs("libhwloc.so.15", "tcmlib==1.3.0", "../..", "hwloc (libhwloc15)"),
    needs("libumf.so.0", "umf==0.10.0", "../..", "oneAPI 2025.1"),
    needs("libur_adapter_level_zero.so.0", "intel-cmplr-lib-ur==2025.1.1", "../..", "oneAPI 2025.1"),
    needs("libur_adapter_opencl.so.0", "intel-cmplr-lib-ur==2025.1.1", "../..", "oneAPI 2025.1"),
    needs("libur_loader.so.0", "intel-cmplr-lib-ur==2025.1.1", "../..", "oneAPI 2025.1"),
    needs("libOpenCL.so.1", "intel-opencl-rt==2025.1.1", "../..", "an OpenCL ICD loader (ocl-icd-libopencl1)"),
    needs("libimf.so", "intel-cmplr-lib-rt==2025.1.1", "../..", "oneAPI 2025.1 compiler runtime"),
    needs("libintlc.so.5", "intel-cmplr-lib-rt==2025.1.1", "../..", "oneAPI 2025.1 compiler runtime"),
    needs("libirc.so", "intel-cmplr-lib-rt==2025.1.1", "../..", "oneAPI 2025.1 compiler runtime"),
    needs("libirng.so", "intel-cmplr-lib-rt==2025.1.1", "../..", "oneAPI 2025.1 compiler runtime"),
    needs("libsvml.so", "intel-cmplr-lib-rt==2025.1.1", "../..", "oneAPI 2025.1 compiler runtime"),
    needs("libsycl.so.8", "intel-sycl-rt==2025.1.1", "../..", "oneAPI 2025.1 (SYCL runtime)"),
    needs("libmkl_core.so.2", "mkl==2025.1.0", "../..", "oneMKL 2025.1"),
    needs("libmkl_def.so.2", "mkl==2025.1.0", "../..", "oneMKL 2025.1"),
    needs("libmkl_intel_ilp64.so.2", "mkl==2025.1.0", "../..", "oneMKL 2025.1"),
    needs("libmkl_sequential.so.2", "mkl==2025.1.0", "../..", "oneMKL 2025.1"),
    needs("libmkl_sycl_blas.so.5", "onemkl-sycl-blas==2025.1.0", "../..", "oneMKL 2025.1"),
    needs("libmkl_sycl_dft.so.5", "onemkl-sycl-dft==2025.1.0", "../..", "oneMKL 2025.1"),
    needs("libmkl_sycl_lapack.so.5", "onemkl-sycl-lapack==2025.1.0", "../..", "oneMKL 2025.1"),
    needs("libmkl_sycl_rng.so.5", "onemkl-sycl-rng==2025.1.0", "../..", "oneMKL 2025.1"),
    needs("libmkl_sycl_sparse.so.5", "onemkl-sycl-sparse==2025.1.0", "../..", "oneMKL 2025.1"),
    Library {
        soname: "libze_loader.so.1",
        wheel: None,
        pinned: None,
        dir: "",
        needed: true,
        system: "the Level Zero loader (level-zero / libze1) of Intel's GPU driver",
    },
    Library {
        soname: "libze_tracing_layer.so.1",
        wheel: None,
        pinned: None,
        dir: "",
        needed: true,
        system: "the Level Zero loader (level-zero / libze1) of Intel's GPU driver",
    },
];

/// Platform tags that make pip pick the same (pinned) file on any x86-64 Linux host and Python.
const MANYLINUX: &[&str] = &["--platform", "manylinux_2_27_x86_64"];
/// libtpu ships one wheel per CPython version, all holding the same plugin: the cp311 one is pinned.
const LIBTPU_WHEEL_TAGS: &[&str] =
    &["--platform", "manylinux_2_31_x86_64", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"];

#[allow(clippy::too_many_arguments)]
const fn spec(
    pip_name: &'static str,
    version: &'static str,
    wheel_file: &'static str,
    sha256: &'static str,
    so_member: &'static str,
    so_sha256: &'static str,
    so_size: u64,
    download_mb: u32,
    pip_args: &'static [&'static str],
) -> PluginSpec {
    PluginSpec { pip_name, version, wheel_file, sha256, so_member, so_sha256, so_size, download_mb, pip_args }
}

const fn cuda(
    name: &'static str,
    plugin: PluginSpec,
    installed_as: &'static str,
    api: (i32, i32),
    (libraries, cuda_tools): (&'static [Library], &'static [LibraryWheel]),
    cuda_data_dir: &'static str,
    library_dir: &'static str,
) -> Target {
    Target {
        name,
        device: Device::Cuda,
        host: Host::LinuxX86_64,
        plugin,
        installed_as,
        platform: "cuda",
        api_version: Some(api),
        accepts: ACCEPTED,
        libraries,
        create_options: GPU_OPTIONS,
        cuda_data_dir,
        cuda_tools,
        library_dir,
    }
}

/// Every target. Within one device, the first row is the one provisioned unless `LAZULI_TARGET` names another.
pub const TARGETS: &[Target] = &[
    Target {
        name: "lammps-jax-pjrt-cpu",
        device: Device::Cpu,
        host: Host::LinuxX86_64,
        plugin: spec(
            "lammps-jax-pjrt-cpu",
            "0.11.2",
            "lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
            "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1",
            "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
            "ad1309ac822b1b24d51b7f9947c7c9fa9ef5d67f390584cbc3d1fa2428fed9c2",
            201_600_336,
            63,
            MANYLINUX,
        ),
        installed_as: "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
        platform: "cpu",
        api_version: Some((0, 115)),
        accepts: ACCEPTED,
        libraries: &[],
        create_options: CPU_OPTIONS,
        cuda_data_dir: "",
        cuda_tools: &[],
        library_dir: "",
    },
    Target {
        name: "xla-cpu-pjrt",
        device: Device::Cpu,
        host: Host::LinuxX86_64,
        plugin: spec(
            "xla-cpu-pjrt",
            "0.0.1",
            "xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_x86_64.whl",
            "55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc",
            "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
            "88c3f28c5900f48ad4a82cab9e79bba9537809743395e341485f8794268820dc",
            259_284_552,
            64,
            MANYLINUX,
        ),
        installed_as: "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
        platform: "cpu",
        api_version: Some((0, 81)),
        accepts: ACCEPTED,
        libraries: &[],
        create_options: &[("cpu_device_count", "int64")],
        cuda_data_dir: "",
        cuda_tools: &[],
        library_dir: "",
    },
    cuda(
        "cuda13",
        spec(
            "jax-cuda13-pjrt",
            "0.12.0.1",
            "jax_cuda13_pjrt-0.12.0.1-py3-none-manylinux_2_27_x86_64.whl",
            "5899bb6177eda86ea532afb9a26794f2bdd04966f6a01f9028266b16c2b6cf90",
            "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
            "b6de513893c09af2c77e71afcef46d9706f8c259337cdef4cd5cae2353886f75",
            395_967_648,
            129,
            MANYLINUX,
        ),
        "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
        (0, 116),
        (CUDA13_LIBRARIES, CUDA13_TOOLS),
        "nvidia/cu13",
        "cuda13",
    ),
    cuda(
        "cuda13-0.11.2",
        spec(
            "jax-cuda13-pjrt",
            "0.11.2",
            "jax_cuda13_pjrt-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
            "e5ff589d43064913bb74027682d89639c7ea48f9f81c2bae6fc75117e913f93e",
            "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
            "43d3efd6fd43d8a5d9aa67176e830d81e4ad5fc19fda4ad09cdcc4aebd9f3920",
            411_465_856,
            128,
            MANYLINUX,
        ),
        "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
        (0, 115),
        (CUDA13_LIBRARIES, CUDA13_TOOLS),
        "nvidia/cu13",
        "cuda13",
    ),
    cuda(
        "cuda12",
        spec(
            "jax-cuda12-pjrt",
            "0.12.0.1",
            "jax_cuda12_pjrt-0.12.0.1-py3-none-manylinux_2_27_x86_64.whl",
            "5ec28e06198d094031c37590b4ea753ae8cde4879ab4b60baf40f0dffb673286",
            "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            "921aaa9c635255fb7b7a660d11c8f702c78a70e7f7d005d4f377c2dc5f0fede2",
            486_596_368,
            183,
            MANYLINUX,
        ),
        "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
        (0, 116),
        (CUDA12_LIBRARIES, CUDA12_TOOLS),
        "nvidia/cuda_nvcc",
        "cuda12",
    ),
    cuda(
        "cuda12-0.11.2",
        spec(
            "jax-cuda12-pjrt",
            "0.11.2",
            "jax_cuda12_pjrt-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
            "2133b3afc63307c016ae4980f166b2b3de199759363ead74f7d550eaae953463",
            "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            "ed4d60d77427548709ca0b5a8e04c1b24cc0091452bb564e4aea01e03ae7eac1",
            497_519_016,
            180,
            MANYLINUX,
        ),
        "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
        (0, 115),
        (CUDA12_LIBRARIES, CUDA12_TOOLS),
        "nvidia/cuda_nvcc",
        "cuda12",
    ),
    Target {
        name: "libtpu",
        device: Device::Tpu,
        host: Host::LinuxX86_64,
        plugin: spec(
            "libtpu",
            "0.0.52",
            "libtpu-0.0.52-cp311-cp311-manylinux_2_31_x86_64.whl",
            "f5e2e596eaea9357fbb5a6755a7a9007c6ab75bfde4a55191b03eff402971140",
            "libtpu/libtpu.so",
            "f86de4d04a058e6b5101f73e0824b95f27e2cec996d2b9191d9cffda75c03077",
            467_479_448,
            131,
            LIBTPU_WHEEL_TAGS,
        ),
        installed_as: "libtpu/libtpu.so",
        platform: "tpu",
        api_version: Some((0, 117)),
        accepts: ACCEPTED,
        libraries: &[],
        create_options: &[],
        cuda_data_dir: "",
        cuda_tools: &[],
        library_dir: "",
    },
    Target {
        name: "rocm7",
        device: Device::Rocm,
        host: Host::LinuxX86_64,
        plugin: spec(
            "jax-rocm7-pjrt",
            "0.12.0",
            "jax_rocm7_pjrt-0.12.0-py3-none-manylinux_2_27_x86_64.whl",
            "4551d0714523355f2946ca1958c3f584e95661e467a641d36b726f718a1c7934",
            "jax_plugins/xla_rocm7/xla_rocm_plugin.so",
            "6e7239347f37f1a5a17c2a2d9301411f9f17e30e0707a717f4717556fa402511",
            459_001_112,
            128,
            MANYLINUX,
        ),
        installed_as: "jax_plugins/xla_rocm7/xla_rocm_plugin.so",
        platform: "rocm",
        api_version: None,
        accepts: ACCEPTED,
        libraries: ROCM_LIBRARIES,
        create_options: GPU_OPTIONS,
        cuda_data_dir: "",
        cuda_tools: &[],
        library_dir: "",
    },
    Target {
        name: "oneapi",
        device: Device::Xpu,
        host: Host::LinuxX86_64,
        plugin: spec(
            "jax-oneapi-pjrt",
            "0.11.2",
            "jax_oneapi_pjrt-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
            "ae7250c5d4459dcfedf4de1bf683edfef0502861e44b6e9bfaa7d8133b4292c1",
            "jax_plugins/xla_oneapi/xla_oneapi_plugin.so",
            "7bdaf7a9aa365742ad4185921f233f99eed16b4f2a02cae2cf9d85b9310da151",
            521_495_584,
            129,
            MANYLINUX,
        ),
        installed_as: "jax_plugins/xla_oneapi/xla_oneapi_plugin.so",
        platform: "sycl",
        api_version: None,
        accepts: ACCEPTED,
        libraries: ONEAPI_LIBRARIES,
        create_options: GPU_OPTIONS,
        cuda_data_dir: "",
        cuda_tools: &[],
        library_dir: "",
    },
    Target {
        name: "metal",
        device: Device::Metal,
        host: Host::MacOsArm64(
            "jax-metal ships macOS arm64 wheels only (a .dylib for Apple's Metal): running it needs lazuli built \
             for aarch64-apple-darwin, dlopen of a .dylib, and the Mach-O checks this table does for ELF",
        ),
        plugin: spec(
            "jax-metal",
            "0.1.1",
            "jax_metal-0.1.1-py3-none-macosx_13_0_arm64.whl",
            "f1dbfecb298cdd3ba6da3ad6dc9a2adb63d71741f8b8ece28c296b32d608b6c8",
            "jax_plugins/metal_plugin/pjrt_plugin_metal_14.dylib",
            "e8e0656f24dc887507f5719926faf51f65546993809d3059add1a3c6c16961bf",
            159_305_768,
            40,
            &["--platform", "macosx_13_0_arm64"],
        ),
        installed_as: "jax_plugins/metal_plugin/pjrt_plugin_metal_14.dylib",
        platform: "METAL",
        api_version: None,
        accepts: ACCEPTED,
        libraries: &[],
        create_options: &[],
        cuda_data_dir: "",
        cuda_tools: &[],
        library_dir: "",
    },
];

/// Apple's other plugin: `jax-mlx-plugin` (0.0.1 to 0.0.4 on PyPI) has no wheel pip picks for macOS arm64 with
/// CPython 3.11 to 3.13, so it is named here and not pinned.
pub const UNPINNED: &[(&str, &str)] =
    &[("jax-mlx-plugin", "macOS only, and no wheel for CPython 3.11-3.13 on macOS 14/15 arm64 resolved; not pinned")];

/// The row called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The rows of `device`, the default first.
pub fn targets_of(device: Device) -> impl Iterator<Item = &'static Target> {
    TARGETS.iter().filter(move |t| t.device == device)
}

#[cfg(test)]
mod tests {
    use super::super::library_wheels;
    use super::*;

    #[test]
    fn pinned_library_wheels_agree_with_their_rows() {
        for t in TARGETS {
            for library in t.libraries {
                let Some(wheel) = library.pinned else { continue };
                assert_eq!(library.wheel, Some(wheel.requirement), "{}", library.soname);
                let stem = format!("{}-{}-py3-none-", wheel.name().replace('-', "_"), wheel.version());
                assert!(wheel.file.starts_with(&stem) && wheel.file.ends_with("_x86_64.whl"), "{}", wheel.file);
                assert!(wheel.sha256.len() == 64 && wheel.sha256.bytes().all(|b| b.is_ascii_hexdigit()));
                assert!(library.dir.starts_with("nvidia/") && library.dir.ends_with("/lib"), "{}", library.dir);
            }
            assert_eq!(t.cuda_tools.is_empty(), t.cuda_data_dir.is_empty(), "{}", t.name);
            assert_eq!(t.library_dir.is_empty(), library_wheels(t).is_empty(), "{}", t.name);
            // Rows that unpack into one directory pin the same files.
            for u in TARGETS.iter().filter(|u| !t.library_dir.is_empty() && u.library_dir == t.library_dir) {
                assert_eq!(library_wheels(t), library_wheels(u), "{} and {}", t.name, u.name);
            }
        }
        let cuda13 = target("cuda13-0.11.2").unwrap();
        let wheels = library_wheels(cuda13);
        assert_eq!(wheels.len(), 13, "eleven library wheels (cuBLAS carries two libraries), nvcc and nvvm");
        let runtime = wheels[0];
        assert_eq!((runtime.name(), runtime.version(), runtime.megabytes()), ("nvidia-cuda-runtime", "13.0.96", 3));
        let platforms = ["--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64"];
        assert_eq!(runtime.pip_args(), platforms);
    }

    #[test]
    fn names_are_unique_and_every_device_has_a_row() {
        for (i, t) in TARGETS.iter().enumerate() {
            assert!(TARGETS[..i].iter().all(|u| u.name != t.name), "{} twice", t.name);
            assert!(t.plugin.wheel_file.starts_with(&t.plugin.pip_name.replace('-', "_")), "{}", t.name);
            assert!(t.installed_as.ends_with(super::super::file_name(t.plugin.so_member)), "{}", t.name);
            if let Some(v) = t.api_version {
                assert!(t.accepts.0 <= v && v <= t.accepts.1, "{}", t.name);
            }
        }
        // The README's table of targets names every row.
        let readme = include_str!("../../../README.md");
        let table = readme.split("### Targets").nth(1).expect("the README's \"Targets\" section");
        for t in TARGETS {
            assert!(table.contains(&format!("`{}`", t.name)), "the README's Targets table lacks {}", t.name);
        }
        for device in Device::ALL {
            assert!(targets_of(device).next().is_some(), "{device:?}");
            assert_eq!(Device::from_setting(device.setting()), Some(device));
        }
    }
}
