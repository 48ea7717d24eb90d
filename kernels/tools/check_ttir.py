#!/usr/bin/env python3
"""Compile Triton IR files with an installed Triton, for a CUDA target, without a GPU; print OK or the error.

A developer's check, not run by CI. It catches what Triton's parser, verifier and lowering reject (syntax, types,
layouts, shared memory over the target's limit) before a kernel reaches XLA.

    python kernels/tools/check_ttir.py DIR_OR_FILE... [--arch 90] [--stats] [--jobs N]

Each `X.ttir` is compiled with the `num_warps` and `num_stages` of a `X.json` beside it when there is one (the
dump of lazuli's kernels writes them: `cargo run -p lazuli-kernels --example dump_ttir -- DIR`), else with
`--num-warps` / `--num-stages`. `--stats` also runs ptxas on the PTX to print registers and spills per thread.
Exit status: 0 when every file compiled.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Shared memory one block may opt into, per compute capability (bytes): Hopper 227 KiB, Ampere A100 163 KiB.
MAX_SHARED = {90: 232448, 80: 166912, 86: 101376, 89: 101376}


def ttir_files(paths):
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(p.glob("*.ttir"))
        elif p.suffix == ".ttir":
            yield p


def launch_options(path, args):
    opts = {"num_warps": args.num_warps, "num_stages": args.num_stages}
    meta = path.with_suffix(".json")
    if meta.exists():
        data = json.loads(meta.read_text())
        opts.update({k: data[k] for k in ("num_warps", "num_stages") if k in data})
    return opts


def ptxas_stats(ptx, arch):
    """Registers and spill bytes per thread, from ptxas -v on the kernel's PTX."""
    from triton import knobs

    suffix = "a" if arch >= 90 else ""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        out = subprocess.run([knobs.nvidia.ptxas.path, "-v", f"--gpu-name=sm_{arch}{suffix}", f.name, "-o",
                              os.devnull], capture_output=True, text=True, check=True).stderr
    finally:
        os.unlink(f.name)
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    return f"regs={regs.group(1) if regs else '?'} spill_stores={spills.group(1) if spills else '?'}"


def check(path, args):
    import triton
    from triton.backends.compiler import GPUTarget

    opts = launch_options(path, args)
    kernel = triton.compile(str(path), target=GPUTarget("cuda", args.arch, 32), options=opts)
    shared = kernel.metadata.shared
    limit = MAX_SHARED.get(args.arch)
    if limit is not None and shared > limit:
        raise RuntimeError(f"needs {shared} bytes of shared memory, over the {limit} of sm_{args.arch}")
    info = f"warps={opts['num_warps']} stages={opts['num_stages']} shared={shared}"
    if args.stats:
        info += " " + ptxas_stats(kernel.asm["ptx"], args.arch)
    return info


def check_one(path, args):
    """`OK ...` or `ERROR ...` for one file (in a worker process when --jobs > 1)."""
    try:
        return True, f"OK    {path}  {check(path, args)}"
    except Exception as e:  # any failure of Triton's pipeline is a finding, reported per file
        first = str(e).strip().splitlines()[:12]
        return False, f"ERROR {path}: {type(e).__name__}: " + "\n      ".join(first)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="TTIR files, or directories of *.ttir files")
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for sm_90 (Hopper)")
    parser.add_argument("--num-warps", type=int, default=4)
    parser.add_argument("--num-stages", type=int, default=3)
    parser.add_argument("--stats", action="store_true", help="also print registers and spills (runs ptxas)")
    parser.add_argument("--jobs", type=int, default=1, help="files compiled at once (processes)")
    args = parser.parse_args()

    files = list(ttir_files(args.paths))
    if not files:
        sys.exit("no .ttir files found")
    failed = 0
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs) as pool:
            results = pool.map(check_one, files, [args] * len(files))
            for ok, line in results:
                failed += not ok
                print(line, flush=True)
    else:
        for path in files:
            ok, line = check_one(path, args)
            failed += not ok
            print(line, flush=True)
    print(f"{len(files) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
