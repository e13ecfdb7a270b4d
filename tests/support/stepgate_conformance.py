"""Conformance harness: runs Stepgate `*.case.yaml` cases against `steppe gate` over MCP, with API/MCP fixtures."""

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import asynccontextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import mcp_types as types
import uvicorn
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from ruamel.yaml import YAML

FINAL = ("finished", "failed")
REPLY_KEYS = ("state", "step", "failures", "error", "is_error", "contain")


def short(text, n=600):
    text = str(text)
    return text if len(text) <= n else text[:n] + f"...[{len(text) - n} more chars]"


def describe(exc):
    """An exception as text, with a task group's sub-exceptions spelled out."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def as_json(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def load_case(path):
    case = YAML(typ="safe", pure=True).load(Path(path).read_text())  # YAML 1.2: PyYAML rejects `/items?shelf=A`
    if not (isinstance(case, dict) and isinstance(case.get("stepfile"), dict) and isinstance(case.get("expect"), dict)
            and isinstance(case["expect"].get("replies"), list)):
        raise ValueError("a case must be a mapping with `stepfile` and `expect.replies`")
    return case


def substitute(value, subs):
    if isinstance(value, str):
        for key, repl in subs.items():
            value = value.replace(key, repl)
        return value
    if isinstance(value, dict):
        return {substitute(k, subs): substitute(v, subs) for k, v in value.items()}
    return [substitute(v, subs) for v in value] if isinstance(value, list) else value


class ApiFixture(ThreadingHTTPServer):
    """HTTP API on 127.0.0.1: routes match method + path+query; answers in order, the last repeating."""

    daemon_threads = True

    def __init__(self, routes):
        super().__init__(("127.0.0.1", 0), ApiHandler)
        self.port, self.routes, self.requests, self.lock = self.server_address[1], routes or [], [], threading.Lock()
        self.served = [0] * len(self.routes)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self):
        self.shutdown()
        self.server_close()

    def answer(self, req):
        with self.lock:
            self.requests.append(req)
            for i, route in enumerate(self.routes):
                if str(route.get("method", "GET")).upper() != req["method"] or route.get("path") != req["path"]:
                    continue
                key = route.get("key")
                if key and req["headers"].get(str(key["header"]).lower()) != str(key["value"]):
                    return 401, {"json": {"error": "missing or wrong key"}}, {}
                answers = route.get("answers") or [{"status": 200}]
                ans, self.served[i] = answers[min(self.served[i], len(answers) - 1)], self.served[i] + 1
                headers = {k.lower(): str(v).replace("{port}", str(self.port)) for k, v in (ans.get("headers") or {}).items()}
                return int(ans.get("status", 200)), ans, headers
            return 404, {"json": {"error": f"no route for {req['method']} {req['path']}"}}, {}


class ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle_any(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0)).decode("utf-8", "replace")
        req = {"method": self.command, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
               "body": body}
        status, ans, headers = self.server.answer(req)
        # Compact JSON, as the reference fixture answers.
        data = json.dumps(ans["json"], separators=(",", ":")).encode() if "json" in ans else str(ans.get("text", "")).encode()
        self.send_response(status)
        ctype = "application/json" if "json" in ans else "text/plain"
        for k, v in ({"content-type": ctype} | headers | {"content-length": str(len(data))}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = handle_any


class McpFixture:
    """Stateless JSON-response Streamable HTTP MCP server at /mcp, requiring `Bearer <token>` (else 401)."""

    def __init__(self, spec):
        self.tools, self.token, self.calls = {t["name"]: t for t in spec.get("tools") or []}, str(spec.get("token")), []
        server = Server("stepgate-fixture", on_list_tools=self.list_tools, on_call_tool=self.call_tool)
        self.app = server.streamable_http_app(json_response=True, stateless_http=True)
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.guarded, log_level="warning", lifespan="on", interface="asgi3"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the MCP fixture did not start")
            time.sleep(0.01)

    async def guarded(self, scope, receive, send):
        if scope["type"] == "http":
            auth = dict(scope.get("headers") or []).get(b"authorization", b"")
            status = 404 if scope["path"] != "/mcp" else 401 if auth != f"Bearer {self.token}".encode() else 0
            if status:
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": json.dumps({"error": f"HTTP {status}"}).encode()})
                return
        await self.app(scope, receive, send)

    async def list_tools(self, ctx, params):
        return types.ListToolsResult(tools=[types.Tool(
            name=t["name"], description=t.get("description"), input_schema=t.get("inputSchema") or {"type": "object"},
            output_schema=t.get("outputSchema")) for t in self.tools.values()])

    async def call_tool(self, ctx, params):
        """A tool answers `text` as a text block and/or `json` as structuredContent; `is_error` sets isError."""
        self.calls.append({"name": params.name, "arguments": params.arguments})
        tool = self.tools.get(params.name) or {"text": f"unknown tool {params.name}", "is_error": True}
        texts = [str(tool["text"])] if "text" in tool else [json.dumps(tool["json"])] if "json" in tool else []
        return types.CallToolResult(content=[types.TextContent(text=t) for t in texts],
                                    structured_content=tool.get("json"), is_error=bool(tool.get("is_error")))

    def close(self):
        self.server.should_exit = True
        self.thread.join(5)


@asynccontextmanager
async def connect(opts, stepfile, work, env, args=()):
    """`steppe gate` as an MCP server over stdio, or `--http <port>` and Streamable HTTP; yields the streams."""
    cmd = [opts.steppe, "gate", str(stepfile), "--ledger-dir", str(work / "ledger"),
           "--calls-per-step", str(opts.calls_per_step), *args]
    with open(work / "server.stderr", "w") as err:
        if opts.transport == "stdio":
            params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=env, cwd=str(work))
            async with stdio_client(params, errlog=err) as streams:
                yield streams
            return
        with socket.create_server(("127.0.0.1", 0)) as sock:
            port = sock.getsockname()[1]
        proc = subprocess.Popen(cmd + ["--http", str(port)], env=env, cwd=work, stdin=subprocess.DEVNULL,
                                stdout=err, stderr=err)
        try:
            deadline = time.monotonic() + 20
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    await anyio.sleep(0.05)
            else:
                raise RuntimeError(f"steppe gate --http never listened on {port} (exit status {proc.poll()})")
            async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as streams:
                yield streams
        finally:
            proc.terminate()
            with suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            proc.kill()
            proc.wait()


def reply_of(result):
    text = "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")
    structured = as_json(text) if result.structured_content is None else result.structured_content
    return {"text": text, "structured": structured if isinstance(structured, dict) else {},
            "is_error": bool(result.is_error)}


async def drive(opts, case, stepfile, work, env, replies):
    """Starts the run and sends the actions until a final state, appending each reply to `replies`."""
    async with connect(opts, stepfile, work, env, [str(a) for a in case.get("args") or []]) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=opts.timeout) as session:
            await session.initialize()
            replies.append(reply_of(await session.call_tool(case["stepfile"]["id"], case.get("inputs") or {})))
            run = replies[0]["structured"].get("run")
            for action in case.get("actions") or []:
                if replies[-1]["structured"].get("state") in FINAL:
                    break
                if "submit" in action:
                    name, arguments = "stepgate_submit", {"run": run, "output": action["submit"]}
                elif "call" in action:
                    name = "stepgate_call"
                    arguments = {"run": run, "operation": action["call"], "arguments": action.get("arguments") or {}}
                else:
                    raise ValueError(f"unknown action {action!r}")
                replies.append(reply_of(await session.call_tool(name, arguments)))


def check_reply(i, want, got):
    st, step = got["structured"], got["structured"].get("step")
    seen = {"state": st.get("state"), "step": step.get("step") if isinstance(step, dict) else step,
            "failures": [f.get("gate") if isinstance(f, dict) else f for f in st.get("failures") or []],
            "error": st.get("error"), "is_error": got["is_error"]}
    problems = [f"unknown expectation {k!r}" for k in want if k not in REPLY_KEYS]
    problems += [f"{k} {seen[k]!r} != expected {want[k]!r}" for k in REPLY_KEYS[:-1] if k in want and seen[k] != want[k]]
    if "contain" in want and str(want["contain"]) not in got["text"]:
        problems.append(f"text lacks {str(want['contain'])!r}")
    return [f"reply {i}: {', '.join(problems)}; reply text: {short(got['text'])!r}"] if problems else []


def jcs(v):
    """RFC 8785 canonical JSON (enough for ledger records, which hold no exotic floats)."""
    if isinstance(v, dict):
        keys = sorted(v, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + jcs(v[k]) for k in keys) + "}"
    if isinstance(v, list):
        return "[" + ",".join(jcs(x) for x in v) + "]"
    return str(int(v)) if isinstance(v, float) and v.is_integer() and abs(v) < 1e21 else json.dumps(v, ensure_ascii=False)


def check_ledger(opts, work, want, stepfile_id):
    """One ledger file; its types as expected; the §1.13 hash chain; `--verify` intact, tampered and dropped."""
    files = sorted((work / "ledger").glob("*.jsonl"))
    if len(files) != 1:
        return [f"ledger dir holds {len(files)} .jsonl files, expected 1: {[f.name for f in files]}"]
    lines = [line for line in files[0].read_text().split("\n") if line.strip()]
    records = [as_json(line) for line in lines]
    if not all(isinstance(r, dict) for r in records):
        return [f"a ledger line is not a JSON object: {[ln for ln, r in zip(lines, records) if not isinstance(r, dict)]}"]
    problems, kinds = [], [r.get("type") for r in records]
    if kinds != want:
        problems.append(f"ledger types {kinds} != expected {want}")
    for i, r in enumerate(records):
        prev = None if i == 0 else "sha256:" + hashlib.sha256(jcs(records[i - 1]).encode()).hexdigest()
        wrong = [k for k, v in (("seq", i), ("prev", prev), ("run", records[0].get("run")), ("stepfile", stepfile_id))
                 if r.get(k) != v]
        if wrong:
            problems.append(f"ledger record {i} has wrong {wrong}: {short(lines[i], 300)}")
            break

    def verify(path, rc, word):
        proc = subprocess.run([opts.steppe, "gate", "--verify", str(path)], capture_output=True, text=True,
                              timeout=opts.timeout)
        if proc.returncode != rc or word not in (proc.stdout if rc == 0 else proc.stdout + proc.stderr):
            problems.append(f"--verify {path.relative_to(work)}: exit {proc.returncode} (want {rc}, {word!r}), "
                            f"stdout {short(proc.stdout, 300)!r}, stderr {short(proc.stderr, 300)!r}")

    verify(files[0], 0, "intact")
    if len(records) >= 3:
        mid = max(1, min(len(records) - 2, len(records) // 2))
        tampered = json.dumps(dict(records[mid], at="1999-01-01T00:00:00Z" if records[mid].get("at") else "x"))
        for label, body in (("tampered", lines[:mid] + [tampered] + lines[mid + 1:]),
                            ("dropped", lines[:mid] + lines[mid + 1:])):
            copy = work / label / files[0].name
            copy.parent.mkdir(exist_ok=True)
            copy.write_text("\n".join(body) + "\n")
            verify(copy, 1, "broken")
    return problems


def check_requests(want, requests):
    """The API's requests as (method, path) in order; listed headers a subset; a listed body equal (as JSON)."""
    pairs, wanted = [(r["method"], r["path"]) for r in requests], [(str(w["method"]).upper(), w["path"]) for w in want]
    if pairs != wanted:
        return [f"API requests {pairs} != expected {wanted}"]
    problems = []
    for i, (w, r) in enumerate(zip(want, requests)):
        problems += [f"request {i} header {k}: {r['headers'].get(k.lower())!r} != expected {v!r}"
                     for k, v in (w.get("headers") or {}).items() if r["headers"].get(k.lower()) != str(v)]
        if "body" in w and as_json(r["body"]) != w["body"]:
            problems.append(f"request {i} body {short(r['body'], 300)!r} != expected {w['body']!r}")
    return problems


async def run_case(opts, path, work):
    result = {"file": path.name, "name": None, "ok": False, "reason": "", "replies": [], "requests": [], "mcp_calls": []}
    api = mcp = None
    try:
        case = load_case(path)
        result["name"], subs, problems = case.get("name", ""), {}, []
        if "api" in case:
            api = ApiFixture((case["api"] or {}).get("routes"))
            subs |= {"${api.origin}": f"http://127.0.0.1:{api.port}", "${api.host}": f"127.0.0.1:{api.port}",
                     "${api.port}": str(api.port)}
        if "mcp" in case:
            mcp = McpFixture(case["mcp"] or {})
            subs |= {"${mcp.origin}": f"http://127.0.0.1:{mcp.port}", "${mcp.host}": f"127.0.0.1:{mcp.port}"}
        case = {k: v if k in ("api", "mcp") else substitute(v, subs) for k, v in case.items()}
        stepfile, expect, replies = work / f"{case['stepfile']['id']}.json", case["expect"], result["replies"]
        stepfile.write_text(json.dumps(case["stepfile"], indent=2, ensure_ascii=False, default=str))
        env = dict(os.environ)
        env |= {str(n).upper().replace("-", "_") + "_API_KEY": str(v) for n, v in (case.get("credentials") or {}).items()}
        env |= {str(n): str(v) for n, v in (case.get("env") or {}).items()}  # settings, say (this repo's cases)
        try:
            with anyio.fail_after(opts.timeout):
                await drive(opts, case, stepfile, work, env, replies)
        except Exception as e:  # any session failure is the case's failure
            stderr = (work / "server.stderr").read_text(errors="replace")[-800:]
            problems.append(f"session error after {len(replies)} replies: {describe(e)} (server stderr: {stderr!r})")
        if not problems and len(replies) != len(expect["replies"]):
            last = short(replies[-1]["text"] if replies else "")
            problems.append(f"{len(replies)} replies, expected {len(expect['replies'])}; last reply text: {last!r}")
        for i, (w, g) in enumerate(zip(expect["replies"], replies)):
            problems += check_reply(i, w or {}, g)
        if "ledger" in expect:
            problems += check_ledger(opts, work, list(expect["ledger"] or []), case["stepfile"]["id"])
        if "requests" in expect:
            problems += check_requests(expect["requests"] or [], api.requests if api else [])
        result["ok"], result["reason"] = not problems, " | ".join(problems)
    except Exception as e:
        where = "cannot parse" if result["name"] is None else "harness error"
        trace = "" if result["name"] is None else " " + short(traceback.format_exc(), 600)
        result["reason"] = f"{where}: {describe(e)}{trace}"
    finally:
        result["requests"], result["mcp_calls"] = list(api.requests) if api else [], list(mcp.calls) if mcp else []
        for fixture in (api, mcp):
            if fixture:
                fixture.close()
    return result


async def main(opts):
    if opts.self_test:
        from stepgate_conformance_selftest import self_test  # beside this file; imports the fixtures from it

        return await self_test(opts)
    results = []
    for path in [p for p in sorted(Path(opts.cases).glob("*.case.yaml")) if not opts.only or opts.only in p.name]:
        work = Path(opts.keep, path.name.removesuffix(".case.yaml")) if opts.keep else Path(tempfile.mkdtemp())
        shutil.rmtree(work, ignore_errors=True)
        work = work.resolve()
        work.mkdir(parents=True)
        results.append(result := await run_case(opts, path, work))
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)
        print(f"ok {path.name}" if result["ok"] else f"FAIL {path.name}: {result['reason']}", flush=True)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    if opts.json_report:
        Path(opts.json_report).write_text(json.dumps(results, indent=2, ensure_ascii=False, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steppe", help="the steppe binary")
    parser.add_argument("--cases", help="directory of *.case.yaml files (with --self-test: only parsed)")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--only", help="run only cases whose file name contains this")
    parser.add_argument("--keep", help="keep each case's work dir (stepfile, ledger, server.stderr) under this dir")
    parser.add_argument("--json-report", help="write per-case results (replies, requests, MCP calls) as JSON here")
    parser.add_argument("--calls-per-step", type=int, default=8, help="for steppe gate; mechanical-each-limit needs 8")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per case")
    parser.add_argument("--self-test", action="store_true", help="check the fixtures without the binary")
    opts = parser.parse_args()
    if not opts.self_test and not (opts.steppe and opts.cases):
        parser.error("--steppe and --cases are required (or --self-test)")
    if opts.steppe:
        opts.steppe = os.path.abspath(opts.steppe) if os.sep in opts.steppe else shutil.which(opts.steppe) or opts.steppe
    sys.exit(anyio.run(main, opts))
