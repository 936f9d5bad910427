"""Writes docs/gpu-verification.md from the log of scripts/test-gpu: the machine's facts,
then one row per `GPU-CHECK | check | figure | bound` line of the log (which may follow
other output on its line, as the test harness prints `test name ... ` before it), its
figure marked where a `GPU-CHECK-FAILED | check` line names it.

  python3 write_report.py LOG REPORT STATUS COMMIT GPU DRIVER CUDA NCCL
"""
import datetime
import re
import sys


def cell(text):
    return text.strip().replace("|", "\\|")


MODEL_ROW = re.compile(r"^([\w.-]+ (?:bf16|MXFP4|\w+ GGUF)): ")


def grouped(rows):
    """The rows with each model's together (parts that ran side by side interleave their
    lines): the checks of no model first, in their order, then each model's in the order
    the models first appear."""
    plain, models = [], {}
    for row in rows:
        m = MODEL_ROW.match(row[0])
        if m:
            models.setdefault(m.group(1), []).append(row)
        else:
            plain.append(row)
    return plain + [row for rows in models.values() for row in rows]


def main():
    log, report, status, commit, gpu, driver, cuda, nccl = sys.argv[1:9]
    rows, failed_checks = [], set()
    for line in open(log, errors="replace"):
        f = re.search(r"GPU-CHECK-FAILED \| (.*)$", line.rstrip("\n"))
        if f:
            failed_checks.add(f.group(1).strip())
            continue
        m = re.search(r"GPU-CHECK \| (.*)$", line.rstrip("\n"))
        if m:
            parts = m.group(1).split(" | ")
            if len(parts) >= 3:
                rows.append((parts[0], " | ".join(parts[1:-1]), parts[-1]))
    rows = grouped(rows)
    failed = status != "0"
    with open(report, "w") as out:
        out.write("# GPU verification\n\n")
        out.write(f"Written by `scripts/test-gpu` on {datetime.date.today()}. Binaries built by "
                  f"`scripts/build-gpu` at commit `{commit}`.\n\n")
        out.write("| | |\n|---|---|\n")
        out.write(f"| device | {cell(gpu)} |\n| driver | {cell(driver)} |\n")
        out.write(f"| CUDA (toolkit on the machine; binaries built with 13.0) | {cell(cuda)} |\n")
        out.write(f"| NCCL (library loaded) | {cell(nccl)} |\n")
        out.write(f"| result | {'FAILED' if failed else 'all checks passed'} ({len(rows)} checks) |\n\n")
        out.write("| check | figure | bound |\n|---|---|---|\n")
        for name, figure, bound in rows:
            mark = " **(failed)**" if name.strip() in failed_checks else ""
            out.write(f"| {cell(name)} | {cell(figure)}{mark} | {cell(bound)} |\n")
        out.write("\nNCCL with several ranks runs here with the ranks sharing the one GPU (NCCL 2.30's\n"
                  "several ranks per GPU: threads of one process, and two processes). NCCL between\n"
                  "distinct GPUs (its peer-to-peer and NVLink transports) and between machines (its\n"
                  "network transports) has not run: these machines have one GPU.\n")


if __name__ == "__main__":
    main()
