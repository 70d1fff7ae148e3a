#!/usr/bin/env python3
"""Runs libiscsi's conformance suite (iscsi-test-cu) against a freesan LUN reached
through two portals (127.0.0.1 and 127.0.0.2, for the multipath tests), parses the
result of every test, and checks it against the recorded floor and the list of
known failures (tests/conformance/known-failures.txt, one `Suite.Test  reason` a line).

    tests/conformance/run.py [--bin target/release/freesan] [--port 3270] [--update]

A second, short pass serves a 512e LUN (512-byte blocks, 4 KiB physical: LBPPB 8)
and runs the tests that skip themselves on one block per sector (LBPPB_TESTS); each
must run to completion and pass. (The main LUN stays 512n: on a 512e LUN libiscsi's
GetLBAStatus.UnmapSingle wants a first descriptor past the LBA it asked for, which
SBC does not allow; docs/0001-iscsi-data-path.md.)

Exits non-zero when fewer tests pass, or fewer run to completion (pass without
skipping themselves), than the floor (tests/conformance/floor: `passed completed
completed-512e`),
or when a test fails that is not listed as a known failure. `--update` rewrites the
floor to the current counts. CUnit counts a test that skips itself ("[SKIPPED] X is
not implemented") as passed; skips are counted and printed separately so the
figure stays honest.
"""
import argparse, os, re, shutil, signal, socket, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
IQN = "iqn.2026-11.org.freesan:conformance"
# Tests that run only where LBPPB > 1 (they skip themselves on the main, 512n LUN).
LBPPB_TESTS = [
    "SCSI.WriteSame10.UnmapUnaligned",
    "SCSI.WriteSame16.UnmapUnaligned",
    "SCSI.CompareAndWrite.InvalidDataOutSize",
    "SCSI.WriteSame10.InvalidDataOutSize",
    "SCSI.WriteSame16.InvalidDataOutSize",
]


def wait_port(host, port, proc, secs=30):
    end = time.time() + secs
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"conformance: freesan exited early with {proc.returncode}")
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"conformance: nothing listens on {host}:{port}")


def parse(log):
    """Returns {Suite.Test: 'passed'|'failed'|'skipped'} from iscsi-test-cu's verbose output.

    The default run goes through the suites more than once (several test families
    hold the same suites); the second and later runs of a name get `#2`, `#3`."""
    results, suite, current, seen = {}, None, None, {}

    def verdict(text):
        nonlocal current
        t = text.strip()
        if t.startswith("passed"):
            results[current] = "skipped" if results[current] == "skipped-pending" else "passed"
            current = None
        elif t.startswith("FAILED"):
            results[current] = "failed"
            current = None

    for line in log.splitlines():
        m = re.match(r"^Suite: (\S+)", line)
        if m:
            suite = m.group(1)
            continue
        m = re.match(r"^  Test: (\S+) \.\.\.(.*)$", line)
        if m:
            name = f"{suite}.{m.group(1)}"
            seen[name] = seen.get(name, 0) + 1
            current = name if seen[name] == 1 else f"{name}#{seen[name]}"
            results[current] = "pending"
            rest = m.group(2)
            if "[SKIPPED]" in rest:
                results[current] = "skipped-pending"
            verdict(rest)
            continue
        if current is None:
            continue
        if "[SKIPPED]" in line and results[current] == "pending":
            results[current] = "skipped-pending"
        verdict(line)
    return results


def stop(proc):
    """SIGTERM for the node we started, SIGKILL if it is still there 20 s later."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_512e(a, work):
    """Serves a 512e LUN from a configuration file and runs LBPPB_TESTS against it.
    Returns (results, output, node_alive)."""
    port = a.port + 1
    cfg = os.path.join(work, "512e.toml")
    with open(cfg, "w") as f:
        f.write(f'data_dir = "{os.path.join(work, "data512e")}"\n'
                f'[[portal]]\naddress = "127.0.0.1:{port}"\n'
                f'[[target]]\niqn = "{IQN}"\n'
                f'[[target.lun]]\npath = "{os.path.join(work, "lun512e.img")}"\n'
                f'size = "64M"\nphysical_block_size = 4096\n')
    log = open(os.path.join(work, "serve-512e.log"), "w")
    proc = subprocess.Popen([a.bin, "serve", "--config", cfg], stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_port("127.0.0.1", port, proc)
        run = subprocess.run(["iscsi-test-cu", "--dataloss", "-t", ",".join(LBPPB_TESTS),
                              f"iscsi://127.0.0.1:{port}/{IQN}/0"],
                             capture_output=True, text=True, timeout=600)
        out = run.stdout + run.stderr
        alive = proc.poll() is None
    finally:
        stop(proc)
    return parse(out), out, alive


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/freesan")
    ap.add_argument("--port", type=int, default=3270)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--update", action="store_true", help="record the current pass count as the floor")
    a = ap.parse_args()
    for tool in ("iscsi-test-cu",):
        if not shutil.which(tool):
            sys.exit(f"conformance: {tool} is missing (apt-get install libiscsi-bin)")
    work = tempfile.mkdtemp(prefix="freesan-conf-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    log_path = os.path.join(work, "serve.log")
    proc = subprocess.Popen(
        [a.bin, "serve", "--portal", f"127.0.0.1:{a.port}", "--portal", f"127.0.0.2:{a.port}",
         "--target", IQN, "--lun", os.path.join(work, f"lun0.img:{a.size}"), "--data-dir", os.path.join(work, "data")],
        stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))
    try:
        wait_port("127.0.0.1", a.port, proc)
        wait_port("127.0.0.2", a.port, proc)
        urls = [f"iscsi://127.0.0.1:{a.port}/{IQN}/0", f"iscsi://127.0.0.2:{a.port}/{IQN}/0"]
        t0 = time.time()
        run = subprocess.run(["iscsi-test-cu", "--dataloss"] + urls, capture_output=True, text=True, timeout=1500)
        secs = time.time() - t0
        out = run.stdout + run.stderr
        alive = proc.poll() is None
    finally:
        stop(proc)
    res512, out512, alive512 = run_512e(a, work)
    os.makedirs("target", exist_ok=True)
    with open("target/conformance.log", "w") as f:
        f.write(out)
    with open("target/conformance-512e.log", "w") as f:
        f.write(out512)
    shutil.copy(log_path, "target/conformance-serve.log")
    shutil.copy(os.path.join(work, "serve-512e.log"), "target/conformance-serve-512e.log")
    shutil.rmtree(work, ignore_errors=True)
    completed512 = sum(1 for v in res512.values() if v == "passed")
    print(f"512e LUN (LBPPB 8): {completed512} of {len(LBPPB_TESTS)} ran to completion and passed")
    for n in LBPPB_TESTS:
        short = n.removeprefix("SCSI.")
        if res512.get(short) != "passed":
            print(f"  512e: {short}: {res512.get(short, 'did not run')}")

    res = parse(out)
    m = re.search(r"tests\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", out)
    if not m:
        print(out[-3000:])
        sys.exit("conformance: iscsi-test-cu printed no run summary")
    total, ran, passed, failed = map(int, m.groups())
    skipped = sum(1 for v in res.values() if v == "skipped")
    failed_names = sorted(k for k, v in res.items() if v == "failed")
    known = {}
    kf = os.path.join(HERE, "known-failures.txt")
    if os.path.exists(kf):
        for line in open(kf):
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, reason = line.partition(" ")
                known[name] = reason.strip()
    floor_path = os.path.join(HERE, "floor")
    floor_words = open(floor_path).read().split() if os.path.exists(floor_path) else []
    floor = int(floor_words[0]) if floor_words else 0
    floor_completed = int(floor_words[1]) if len(floor_words) > 1 else 0
    floor_512e = int(floor_words[2]) if len(floor_words) > 2 else 0
    completed = passed - skipped

    print(f"iscsi-test-cu: {total} tests, {passed} passed ({passed - skipped} ran to completion, "
          f"{skipped} skipped by the test itself), {failed} failed, in {secs:.0f} s")
    unexpected = [n for n in failed_names if n not in known]
    for n in failed_names:
        print(f"  FAILED {n}" + (f"  (known: {known[n]})" if n in known else "  (NOT in known-failures.txt)"))
    fixed = [n for n in known if res.get(n) in ("passed", "skipped")]
    for n in fixed:
        print(f"  now passing, remove from known-failures.txt: {n}")
    if not alive:
        print("conformance: freesan died during the run; see target/conformance-serve.log")
    print(f"conformance: {passed} passed, {failed} failed")
    if a.update:
        with open(floor_path, "w") as f:
            f.write(f"{passed} {completed} {completed512}\n")
        print(f"floor recorded: {passed} passed, {completed} ran to completion, "
              f"{completed512} on the 512e LUN")
        return
    bad = False
    if passed < floor:
        print(f"conformance: {passed} passed is below the recorded floor {floor}")
        bad = True
    if completed < floor_completed:
        print(f"conformance: {completed} ran to completion is below the recorded floor {floor_completed}")
        bad = True
    if unexpected:
        print(f"conformance: {len(unexpected)} failing tests are not listed in known-failures.txt")
        bad = True
    if completed512 < floor_512e or completed512 < len(LBPPB_TESTS):
        print(f"conformance: {completed512} of the {len(LBPPB_TESTS)} 512e tests ran to completion "
              f"and passed (floor {floor_512e})")
        bad = True
    if not alive or not alive512:
        if not alive512:
            print("conformance: freesan died during the 512e pass; see target/conformance-serve-512e.log")
        bad = True
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
