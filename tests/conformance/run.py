#!/usr/bin/env python3
"""Runs libiscsi's conformance suite (iscsi-test-cu) against a freesan LUN reached
through two portals (127.0.0.1 and 127.0.0.2, for the multipath tests), parses the
result of every test, and checks it against the recorded floor and the list of
known failures (tests/conformance/known-failures.txt, one `Suite.Test  reason` a line).

    tests/conformance/run.py [--bin target/release/freesan] [--port 3270] [--update]

Short passes follow (SIDE_PASSES), each on a LUN of its own: a 512e LUN (512-byte
blocks, 4 KiB physical: LBPPB 8) runs the tests that skip themselves on one block per
sector (LBPPB_TESTS), a write-protected LUN the tests that skip themselves on a
writable one (READONLY_TESTS), a LUN that may be wiped the SANITIZE tests
(SANITIZE_TESTS, with --allow-sanitize); each must run to completion and pass (but
the few that skip a part of themselves, which must pass). (The main LUN
stays 512n: on a 512e LUN libiscsi's GetLBAStatus.UnmapSingle wants a first
descriptor past the LBA it asked for, which SBC does not allow;
docs/0001-iscsi-data-path.md.)

Exits non-zero when fewer tests pass, or fewer run to completion (pass without
skipping themselves), than the floor (tests/conformance/floor: `passed completed` and
then one count per short pass, in SIDE_PASSES' order),
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
# Tests that run only on a write-protected LUN (MODE SENSE's WP bit set).
READONLY_TESTS = ["SCSI.ReadOnly.ReadOnlySBC"]
# SANITIZE wipes the LUN, so iscsi-test-cu runs these only with --allow-sanitize,
# on a LUN of their own. The overwrite is paced (6 MiB/s: about 11 s for the 64 MiB
# LUN) because Sanitize.Reset needs it still running after its resets and a new
# login, and NOP-In pings wait 120 s for an answer because that test then sleeps
# 60 s between commands without servicing its connection. CryptoErase is left out:
# freesan does not encrypt, so it offers no CRYPTOGRAPHIC ERASE and that test
# skips itself. Readonly and Reservations run their OVERWRITE and BLOCK ERASE
# checks and skip their CRYPTO ERASE one, so they must pass but do not count as
# run to completion (SANITIZE_PARTIAL).
SANITIZE_TESTS = [
    "SCSI.Sanitize." + t for t in [
        "BlockErase", "BlockEraseReserved", "CryptoEraseReserved", "ExitFailureMode",
        "InvalidServiceAction", "Overwrite", "OverwriteReserved", "Readonly",
        "Reservations", "Reset",
    ]
]
SANITIZE_PARTIAL = ["SCSI.Sanitize.Readonly", "SCSI.Sanitize.Reservations"]
# The short passes after the main one: name, what they print, the lines that
# follow the LUN's path and size (its keys, then any tables), the tests each runs
# (each must pass, and run to completion unless it is in the last list),
# iscsi-test-cu's extra flags, and the tests that may skip a part of themselves.
SIDE_PASSES = [
    ("512e", "512e LUN (LBPPB 8)", "physical_block_size = 4096\n", LBPPB_TESTS, [], []),
    ("readonly", "read-only LUN", "read_only = true\n", READONLY_TESTS, [], []),
    ("sanitize", "sanitize LUN",
     "sanitize_rate_mib_s = 6\n[limits]\nnop_in_timeout_ms = 120000\n", SANITIZE_TESTS,
     ["--allow-sanitize"], SANITIZE_PARTIAL),
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


def run_side(a, work, name, port, lun_toml, tests, flags):
    """Serves one LUN from a configuration file (`lun_toml`: extra lines of its
    [[target.lun]]) and runs `tests` against it. Returns (results, output, node_alive)."""
    cfg = os.path.join(work, f"{name}.toml")
    img = os.path.join(work, "lun-" + name + ".img")
    # made here: a read-only LUN's file is opened, never created
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    with open(cfg, "w") as f:
        f.write(f'data_dir = "{os.path.join(work, "data-" + name)}"\n'
                f'[[portal]]\naddress = "127.0.0.1:{port}"\n'
                f'[[target]]\niqn = "{IQN}"\n'
                f'[[target.lun]]\npath = "{img}"\n'
                f'size = "64M"\n{lun_toml}')
    log = open(os.path.join(work, f"serve-{name}.log"), "w")
    proc = subprocess.Popen([a.bin, "serve", "--config", cfg], stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_port("127.0.0.1", port, proc)
        run = subprocess.run(["iscsi-test-cu", "--dataloss", *flags, "-t", ",".join(tests),
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
    sides = []
    for i, (name, label, lun_toml, tests, flags, partial) in enumerate(SIDE_PASSES):
        res_s, out_s, alive_s = run_side(a, work, name, a.port + 1 + i, lun_toml, tests, flags)
        sides.append((name, label, tests, partial, res_s, out_s, alive_s))
    os.makedirs("target", exist_ok=True)
    with open("target/conformance.log", "w") as f:
        f.write(out)
    shutil.copy(log_path, "target/conformance-serve.log")
    side_completed = []
    side_bad = []
    for name, label, tests, partial, res_s, out_s, _ in sides:
        with open(f"target/conformance-{name}.log", "w") as f:
            f.write(out_s)
        shutil.copy(os.path.join(work, f"serve-{name}.log"), f"target/conformance-serve-{name}.log")
        done = sum(1 for v in res_s.values() if v == "passed")
        side_completed.append(done)
        print(f"{label}: {done} of {len(tests)} ran to completion and passed"
              + (f" ({len(partial)} more must pass, skipping a part)" if partial else ""))
        bad_here = 0
        for n in tests:
            short = n.removeprefix("SCSI.")
            got = res_s.get(short, "did not run")
            if got == "passed" or (n in partial and got == "skipped"):
                continue
            bad_here += 1
            print(f"  {name}: {short}: {got}")
        side_bad.append(bad_here)
    shutil.rmtree(work, ignore_errors=True)

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
    floor_sides = [int(w) for w in floor_words[2:]]
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
            f.write(" ".join(str(n) for n in [passed, completed] + side_completed) + "\n")
        print(f"floor recorded: {passed} passed, {completed} ran to completion, "
              + ", ".join(f"{n} on the {s[0]} LUN" for n, s in zip(side_completed, sides)))
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
    for i, (name, label, tests, partial, res_s, out_s, alive_s) in enumerate(sides):
        want = floor_sides[i] if i < len(floor_sides) else 0
        if side_completed[i] < want or side_bad[i] > 0:
            print(f"conformance: {side_completed[i]} of the {len(tests)} tests of the {label} ran to "
                  f"completion and passed, {side_bad[i]} did not pass as they must (floor {want})")
            bad = True
        if not alive_s:
            print(f"conformance: freesan died during the {name} pass; see target/conformance-serve-{name}.log")
            bad = True
    if not alive:
        bad = True
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
