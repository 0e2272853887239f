#!/usr/bin/env python3
"""Markdown rows of kiln's wgpu backend beside its CUDA backend, from two `kiln bench run`
reports taken in one call on one GPU (bench/gpu_wgpu.sh writes them).

    python3 bench/wgpu_table.py kiln_cuda.json kiln_wgpu.json [--all]
"""
import json
import sys

KEY = (
    "peak/copy",
    "gemm/f32/1024/", "gemm/f32/2048/", "gemm/f32/4096/", "gemm/f16/1024/", "gemm/f16/4096/",
    "gemm/f32/256x784x128/", "elementwise/add/f32/16777216", "elementwise/add/f32/67108864",
    "elementwise/mul/f32/67108864", "reduce/sum/f32/16777216", "reduce/sum/f32/67108864",
    "reduce/max/f32/67108864", "reduce/argmax/f32/67108864", "softmax/f32/4096x1024",
    "softmax/f32/32768x4096", "train/mlp784-128-10/b256/epoch", "train/mlp784-1024-10/b256/epoch",
    "train/step/step",
)


def load(path):
    report = json.load(open(path))
    return report, {r["name"]: r for r in report["results"]}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    every = "--all" in sys.argv
    (meta_c, cuda), (meta_w, wgpu) = load(args[0]), load(args[1])
    copy = cuda.get("peak/copy/f32/67108864", {}).get("value")
    print("| workload | CUDA backend | wgpu (Vulkan) | wgpu / CUDA | wgpu % of CUDA copy bandwidth |")
    print("|---|---|---|---|---|")
    for name, w in wgpu.items():
        if not every and not any(name.startswith(k) for k in KEY):
            continue
        c = cuda.get(name)
        ratio = f"{c['median_ms'] / w['median_ms']:.2f}" if c else ""
        cv = f"{c['value']:.2f} {c['unit']}" if c else ""
        bw = f"{100 * w['value'] / copy:.0f}%" if copy and w["unit"] == "GB/s" else ""
        print(f"| {name} | {cv} | {w['value']:.2f} {w['unit']} | {ratio} | {bw} |")


if __name__ == "__main__":
    main()
