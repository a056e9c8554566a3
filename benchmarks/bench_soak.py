"""A soak of the agent service: `racktwin demo` at real time (or any speed), its memory and CPU over time.

    python benchmarks/bench_soak.py                         # 60 site minutes at 1x (an hour), a sample a minute
    python benchmarks/bench_soak.py --minutes 10 --speed 1 --every-s 30

The demo process holds the agent service (enforce mode) and reads the truth log for its progress
line; the simulator runs in a child process of it. Every ``--every-s`` wall seconds this script
reads the demo process's resident memory and CPU seconds from /proc (Linux), and at the end prints
them as a table with the demo's own summary (``--json``): facility energy against the run without
the agent, rack-seconds over a limit, commands applied / rejected / expired (from the simulator's
summary.json in ``--out``). A service that leaks shows as memory that keeps growing at a steady
rate; one that falls behind shows as expired commands.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rss_and_cpu(pid: int) -> tuple[float, float] | None:
    """Resident memory (MiB) and CPU seconds (user + system) of a live process; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    rss_kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    ticks = os.sysconf("SC_CLK_TCK")
    return rss_kib / 1024.0, (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="site minutes (default 60)")
    ap.add_argument("--speed", type=float, default=1.0, help="site seconds per wall second (default 1)")
    ap.add_argument("--every-s", type=float, default=60.0, help="wall seconds between samples (default 60)")
    ap.add_argument("--out", default="/tmp/racktwin-bench-soak", help="the demo's output folder")
    args = ap.parse_args()
    # `racktwin demo` of this checkout (not an installed racktwin's console script)
    cmd = [sys.executable, "-m", "agent.cli", "demo", "--speed", f"{args.speed:g}", "--minutes", f"{args.minutes:g}"]
    cmd += ["--out", args.out, "--json", "--progress-interval-s", "3600"]
    print(f"# bench_soak: {time.strftime('%Y-%m-%d %H:%M')}, {' '.join(cmd[3:])}", flush=True)
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO, env=env, text=True)
    samples: list[tuple[float, float, float]] = []
    while proc.poll() is None:
        s = rss_and_cpu(proc.pid)
        if s is not None:
            samples.append((time.monotonic() - t0, *s))
            print(f"  {samples[-1][0]:7.0f} s  RSS {s[0]:7.1f} MiB  CPU {s[1]:7.1f} s", file=sys.stderr, flush=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(args.every_s)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"racktwin demo exited with {proc.returncode}")
    if not samples:
        raise SystemExit("racktwin demo ended before its first sample: nothing to report")
    demo = json.loads(out)
    sim = json.loads((Path(args.out) / "summary.json").read_text())
    print("\n| wall s | RSS MiB | CPU s (the demo process: agent + progress) |\n|---:|---:|---:|")
    for t, rss, cpu in samples:
        print(f"| {t:.0f} | {rss:.1f} | {cpu:.1f} |")
    a, b = demo["agent"], demo["baseline"]
    first = next((x for x in samples if x[0] >= 10.0), samples[0])  # once Python and the agent are loaded
    last = samples[-1]
    print(
        f"\nRSS {first[1]:.1f} -> {last[1]:.1f} MiB; CPU {last[2] / max(last[0], 1e-9):.1%} of one core; facility "
        f"{a['facility_energy_kwh']:.1f} vs {b['facility_energy_kwh']:.1f} kWh "
        f"({a['facility_energy_kwh'] / b['facility_energy_kwh'] - 1:+.1%}); over a limit "
        f"{a['limit_violation_s']:.0f} vs {b['limit_violation_s']:.0f} rack-s; hottest die "
        f"{a['max_die_temp_c']:.1f} deg C; commands {sim['commands_applied']} applied, "
        f"{sim['commands_rejected']} rejected, {sim['commands_expired']} expired"
    )


if __name__ == "__main__":
    main()
