#!/usr/bin/env python3
"""bench.json: what one `scripts/gpu-check.sh` session measured, in one file
(docs/gpu-bench.json is a copy of one). From the files the steps wrote to a
folder:

  sweep-train*.json, torch-*.json  every case of sweep and of PyTorch
  kernels.json (the model's shapes) or kernels-small.json (the sanitizer's
                                   small shapes)   each kernel against its CPU twin
  tests.txt                        the GPU integration tests, test by test
  sanitizer.txt                    compute-sanitizer's verdict per tool

with the device, the date and the commit the binaries were built from.

    python3 scripts/gpu-bench-json.py OUT_DIR COMMIT
"""
import datetime
import glob
import json
import os
import re
import sys


def cases(out):
    found = []
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "sweep-train*.json")))
    names += sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "torch-*.json")))
    for name in names:
        path = os.path.join(out, name)
        if os.path.exists(path):
            found += json.load(open(path))
    return found


def kernels(out):
    for name, shapes in (("kernels.json", "the model's"), ("kernels-small.json", "small (the sanitizer's)")):
        path = os.path.join(out, name)
        if os.path.exists(path):
            report = json.load(open(path))
            rows = [
                {k: r.get(k) for k in ("op", "shape", "dtype", "max_rel_err", "tolerance", "ok", "kernel_ms", "composed_ms")}
                for r in report["rows"]
            ]
            return {"shapes": f"{shapes}: {report['model']}, {report['tokens']} tokens", "all_ok": all(r["ok"] for r in rows), "rows": rows}
    return None


def tests(out):
    path = os.path.join(out, "tests.txt")
    if not os.path.exists(path):
        return None
    text = open(path).read()
    each = {m[1]: m[2] for m in re.finditer(r"^test (\S+) \.\.\. (\w+)", text, re.M)}
    result = re.search(r"^test result: .*$", text, re.M)
    return {"each": each, "result": result[0] if result else "no result: the step was cut off"}


def sanitizer(out):
    """Per tool: its summary line, or why there is none, and the kernels named."""
    path = os.path.join(out, "sanitizer.txt")
    if not os.path.exists(path):
        return None
    verdicts = {}
    for part in re.split(r"^\$ ", open(path).read(), flags=re.M)[1:]:
        tool = re.search(r"--tool (\w+)", part)
        if not tool:
            continue
        name = tool[1] + (" (control: PyTorch, cuBLAS)" if " python3 " in part.splitlines()[0] else "")
        summary = re.search(r"^========= (?:\w+ )?SUMMARY: .*$", part, re.M)
        cut = re.search(r"^gpu-check: exit .*$", part, re.M)
        kernels = sorted(set(re.findall(r"^=========\s+at (\S+?)\+0x", part, re.M)))
        verdicts[name] = {
            "summary": summary[0].strip("= ") if summary else (cut[0] if cut else "no summary"),
            "kernels_named": kernels,
        }
    return verdicts


def main():
    out, commit = sys.argv[1], sys.argv[2]
    found = cases(out)
    devices = sorted({c["device"] for c in found if c.get("device")})
    bench = {
        "device": devices[0] if len(devices) == 1 else devices,
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "cases": found,
        "kernels": kernels(out),
        "tests": tests(out),
        "sanitizer": sanitizer(out),
    }
    json.dump(bench, open(os.path.join(out, "bench.json"), "w"), indent=1)
    print(f"bench.json: {len(found)} cases on {bench['device']}")


if __name__ == "__main__":
    main()
