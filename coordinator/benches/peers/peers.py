"""steppe beside Ray, Dask and Celery on the workloads of coordinator/benches: in one sitting.

Each workload is run by raw spawning (the floor), by steppe and by every peer
installed, each system's runs interleaved with the floor's so that a slow spell
of the machine touches both, and printed as its median and its ratio to the
floor's median. Every system runs the very command steppe's task runs
(`sh -c CMD`) in a process of its own, on its own long-lived workers; a peer's
cluster start is not timed (as steppe's coordinator and workers are up before
a `steppe submit`), only the submission to the last result.

  steps    1,000 `sh -c true`, two at a time: steppe embedded (`steppe run
           --workers 2`, the whole process) and on a Redis cluster of two
           workers of one slot (`steppe submit`); Ray on 2 CPUs, Dask's
           LocalCluster of two one-thread worker processes, Celery with two
           `solo` workers on Redis.
  keep-up  5,000 `sh -c "sleep 1"`, 1,000 in flight across ten worker
           processes: steppe's ten workers of 100 slots; Ray's ten async
           actors of 100 concurrent calls; Dask's ten workers of 100 threads;
           Celery's ten `threads` workers of 100.
  conversations
           2,000 agent conversations at once on one worker, four turns each
           against steppe's scripted model answering after 50 ms (three calls
           of built-in tools, then an answer): `steppe test` (its model
           inside, HTTP/2) and `steppe run` (the model in a process of its
           own, HTTP/1.1); each peer runs conversation.py's chat loop against
           that same model process, offering the very tools steppe offers:
           Ray in one async actor, Dask and Celery in one worker of 2,000
           threads. Measured against the ideal 4 x 50 ms only.

Run it with scripts/bench-peers, which makes the venv and builds steppe.
"""

import argparse
import asyncio
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what, timeout=60):
    t = time.monotonic()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() - t > timeout:
                sys.exit(f"peers: {what} did not start on port {port}")
            time.sleep(0.05)


class Redis:
    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--maxclients", "10000"],
            stdout=subprocess.DEVNULL,
        )
        wait_port(self.port, "redis-server")
        self.url = f"redis://127.0.0.1:{self.port}/"

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def raw(n, at_once, cmd):
    """`sh -c CMD` spawned `n` times, `at_once` at a time, by xargs: the floor."""
    t = time.monotonic()
    subprocess.run(["xargs", "-d", "\\n", "-P", str(at_once), "-n", "1", "sh", "-c"], input=(cmd + "\n") * n, text=True, check=True)
    return time.monotonic() - t


def across(n, in_flight, run):
    values = ", ".join(str(i) for i in range(n))
    return f'jobs:\n- name: many\n  plan:\n  - task: cell\n    across:\n    - var: i\n      values: [{values}]\n    max_in_flight: {in_flight}\n    run: "{run}"\n'


def timed(argv, cwd):
    t = time.monotonic()
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    took = time.monotonic() - t
    if out.returncode != 0:
        sys.exit(f"peers: {' '.join(argv)} failed:\n{out.stdout}{out.stderr}")
    return took


class SteppeCluster:
    """A coordinator on Redis (queue and store) and `workers` processes of `slots`."""

    def __init__(self, steppe, cwd, workers, slots):
        self.steppe, self.cwd, self.redis = steppe, cwd, Redis()
        self.coordinator = subprocess.Popen(
            [steppe, "coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state", "--queue", self.redis.url, "--store", self.redis.url],
            cwd=cwd, stdout=subprocess.PIPE, text=True,
        )
        first = self.coordinator.stdout.readline()
        self.url = "http://" + first.split("serving workers on ")[1].strip()
        self.workers = [
            subprocess.Popen([steppe, "worker", "--coordinator", self.url, "--slots", str(slots)], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(workers)
        ]
        joined, t = 0, time.monotonic()
        while joined < workers:
            line = self.coordinator.stdout.readline()
            if not line or time.monotonic() - t > 60:
                sys.exit("peers: steppe's workers did not join")
            joined += " joined (" in line
        # The coordinator's log goes on; drain it so it never blocks.
        threading.Thread(target=lambda: [None for _ in self.coordinator.stdout], daemon=True).start()

    def submit(self, file):
        return timed([self.steppe, "submit", file, "--coordinator", self.url, "-q", "--force"], self.cwd)

    def stop(self):
        for p in self.workers + [self.coordinator]:
            p.kill()
            p.wait()
        self.redis.stop()


# --- the peers: each a start (untimed), a timed batch, a stop -------------


def sh(cmd):
    return subprocess.run(["sh", "-c", cmd]).returncode


class Ray:
    name = "Ray"

    def __init__(self, workload, talk=None):
        import ray

        self.ray = ray
        if workload == "conversations":
            ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")

            class Talker:
                def __init__(self):
                    self.session = None

                async def talk(self, url, tools, i):
                    import aiohttp

                    import conversation

                    if self.session is None:
                        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                    return await conversation.run_async(self.session, url, tools, i)

            actor = ray.remote(num_cpus=1, max_concurrency=talk.n)(Talker).remote()
            self.batch = lambda n, _: ray.get([actor.talk.remote(talk.url, talk.tools, i) for i in range(n)])
        elif workload == "steps":
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
            self.cell = ray.remote(num_cpus=1)(sh)
            self.batch = lambda n, cmd: ray.get([self.cell.remote(cmd) for _ in range(n)])
        else:
            ray.init(num_cpus=10, include_dashboard=False, log_to_driver=False, logging_level="ERROR")

            class Cells:
                async def run(self, cmd):
                    p = await asyncio.create_subprocess_exec("sh", "-c", cmd)
                    return await p.wait()

            actor = ray.remote(num_cpus=1, max_concurrency=100)(Cells)
            actors = [actor.remote() for _ in range(10)]
            self.batch = lambda n, cmd: ray.get([actors[i % 10].run.remote(cmd) for i in range(n)])

    def stop(self):
        self.ray.shutdown()


class Dask:
    name = "Dask"

    def __init__(self, workload, talk=None):
        from dask.distributed import Client, LocalCluster

        workers, threads = {"steps": (2, 1), "keep-up": (10, 100), "conversations": (1, talk and talk.n)}[workload]
        self.cluster = LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True, dashboard_address=None, silence_logs=logging.CRITICAL)
        self.client = Client(self.cluster)
        if workload == "conversations":
            import conversation

            self.batch = lambda n, _: self.client.gather(self.client.map(conversation.run, [talk.url] * n, [talk.tools] * n, range(n), pure=False))
        else:
            self.batch = lambda n, cmd: self.client.gather(self.client.map(sh, [cmd] * n, pure=False))

    def stop(self):
        self.client.close()
        self.cluster.close()


class Celery:
    name = "Celery"

    def __init__(self, workload, talk=None):
        self.redis = Redis()
        env = dict(os.environ, PEERS_BROKER=self.redis.url)
        # An app of its own each time (the workers load celery_cells): no
        # connection is kept from an earlier workload's broker.
        from celery import Celery as App

        self.app = App("celery_cells", broker=self.redis.url, backend=self.redis.url)
        workers, pool = {
            "steps": (2, ["-P", "solo"]),
            "keep-up": (10, ["-P", "threads", "-c", "100"]),
            "conversations": (1, ["-P", "threads", "-c", str(talk and talk.n)]),
        }[workload]
        self.workers = [
            subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "celery_cells", "worker", "--loglevel", "WARNING", "--prefetch-multiplier", "1", "-n", f"w{i}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", *pool],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            for i in range(workers)
        ]
        t = time.monotonic()
        while len(self.app.control.ping(timeout=0.5) or []) < workers:
            if time.monotonic() - t > 60 or any(p.poll() is not None for p in self.workers):
                sys.exit("peers: Celery's workers did not start (run one by hand: python -m celery -A celery_cells worker)")
        from celery import group

        if workload == "conversations":
            self.batch = lambda n, _: group(self.app.signature("celery_cells.talk", args=(talk.url, talk.tools, i)) for i in range(n)).apply_async().get(timeout=600)
        else:
            self.batch = lambda n, cmd: group(self.app.signature("celery_cells.cell", args=(cmd,)) for _ in range(n)).apply_async().get(timeout=600)

    def stop(self):
        for p in self.workers:
            p.kill()
            p.wait()
        self.redis.stop()


PEERS = {"ray": Ray, "dask": Dask, "celery": Celery}

WORKLOADS = {
    # name: (steps, at once, command, workers, slots each, ideal seconds)
    "steps": (1000, 2, "true", 2, 1, None),
    "keep-up": (5000, 1000, "sleep 1", 10, 100, 5.0),
    "conversations": (2000, 2000, None, 1, 2000, 0.2),
}

# The model of the conversations workload, as coordinator/benches/conversations.rs has it.
SCENARIO = os.path.normpath(os.path.join(HERE, "..", "support", "conversation-model.yaml"))


class Talk:
    """The scripted model in a process of its own, and the tools a steppe agent offers it."""

    def __init__(self, steppe, work, n):
        self.n = n
        with open(os.path.join(work, "one.yml"), "w") as f:
            f.write(conversations(1, None))
        timed([steppe, "test", "one.yml", "--script", SCENARIO, "-q", "--dump-requests", "requests.jsonl"], work)
        with open(os.path.join(work, "requests.jsonl")) as f:
            first = json.loads(json.loads(f.readline())["raw"])
        # The very tools steppe's agent step offers, so every body is as long.
        self.tools = first["tools"]
        port = free_port()
        self.model = subprocess.Popen([steppe, "scripted-model", "--script", SCENARIO, "--listen", f"127.0.0.1:{port}"], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port, "steppe scripted-model")
        self.endpoint = f"http://127.0.0.1:{port}/v1/"
        self.url = self.endpoint + "chat/completions"

    def stop(self):
        self.model.kill()
        self.model.wait()


def conversations(n, endpoint):
    source = f'{{model: x/y, endpoint: "{endpoint}"}}' if endpoint else "{model: openrouter/x/y}"
    values = ", ".join(str(i) for i in range(n))
    return (
        f"agents:\n- name: a\n  source: {source}\njobs:\n- name: many\n  plan:\n  - agent: a\n    across:\n    - var: i\n"
        f'      values: [{values}]\n    max_in_flight: {n}\n    messages: ["Conversation {{{{ .vars.i }}}}."]\n'
    )


def report(label, times, floor, ideal):
    m = statistics.median(times)
    beside = [f"{m / floor:>6.2f}x the floor" if floor else "", f"{m / ideal:>6.2f}x the ideal" if ideal else ""]
    print(f"  {label:<38} {m * 1e3:>9.0f} ms   " + "   ".join(b for b in beside if b), flush=True)


def measure(batch, floor, runs):
    """`runs` of `batch` (after one to warm it), each after a run of `floor` (if any)."""
    batch()
    own, floors = [], []
    for _ in range(runs):
        if floor:
            floors.append(floor())
        own.append(batch())
    return own, floors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steppe", required=True, help="the steppe binary")
    ap.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    ap.add_argument("--peers", default="ray,dask,celery", help="comma-separated, of: ray, dask, celery (default all)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each system (median taken; default 5)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="steppe-peers-")
    # Every peer's processes start here: the conversations' tools read it.
    os.chdir(work)
    # And import this folder's modules (conversation, celery_cells).
    sys.path.insert(0, HERE)
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE, *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        for workload in WORKLOADS if a.workload == "all" else [a.workload]:
            n, at_once, cmd, workers, slots, ideal = WORKLOADS[workload]
            rows, talk, floor = [], None, None
            if workload == "conversations":
                print(f"conversations: {n} at once on one worker, four turns of 50 ms (steppe's scripted model); median of {a.runs}", flush=True)
                talk = Talk(a.steppe, work, n)
                with open(os.path.join(work, "many.yml"), "w") as f:
                    f.write(conversations(n, None))
                with open(os.path.join(work, "apart.yml"), "w") as f:
                    f.write(conversations(n, talk.endpoint))
                test = lambda: timed([a.steppe, "test", "many.yml", "--script", SCENARIO, "-q", "--workers", str(n)], work)
                rows.append(("steppe test (the model inside)", *measure(test, None, a.runs)))
                apart = lambda: timed([a.steppe, "run", "apart.yml", "-q", "--workers", str(n)], work)
                rows.append(("steppe run (the model apart)", *measure(apart, None, a.runs)))
            else:
                print(f"{workload}: {n} x `sh -c {cmd!r}`, {at_once} at a time, {workers} workers of {slots}; median of {a.runs}", flush=True)
                floor = lambda: raw(n, at_once, cmd)
                with open(os.path.join(work, "many.yml"), "w") as f:
                    f.write(across(n, at_once, cmd))
                if workload == "steps":
                    run = lambda: timed([a.steppe, "run", "many.yml", "-q", "--force", "--workers", str(at_once)], work)
                    rows.append(("steppe embedded (whole run)", *measure(run, floor, a.runs)))
                c = SteppeCluster(a.steppe, work, workers, slots)
                try:
                    rows.append(("steppe cluster (whole submit)", *measure(lambda: c.submit("many.yml"), floor, a.runs)))
                finally:
                    c.stop()
            try:
                for key in a.peers.split(","):
                    peer = PEERS[key.strip()](workload, talk)
                    try:
                        def batch():
                            t = time.monotonic()
                            out = peer.batch(n, cmd)
                            took = time.monotonic() - t
                            if talk:
                                assert len(out) == n and all(len(m) == 8 for m in out), f"{peer.name}: a conversation did not run its four turns"
                            else:
                                assert len(out) == n and not any(out), f"{peer.name}: a cell failed"
                            return took

                        rows.append((peer.name, *measure(batch, floor, a.runs)))
                    finally:
                        peer.stop()
            finally:
                if talk:
                    talk.stop()
            if ideal:
                print(f"  {'ideal':<38} {ideal * 1e3:>9.0f} ms", flush=True)
            if floor:
                print(f"  {'floor (xargs -P, all runs)':<38} {statistics.median([t for _, _, fl in rows for t in fl]) * 1e3:>9.0f} ms", flush=True)
            for label, own, fl in rows:
                report(label, own, fl and statistics.median(fl), ideal)
    finally:
        os.chdir("/")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
