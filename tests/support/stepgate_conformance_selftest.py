"""Self-test of stepgate_conformance.py without the real binary: its fixtures, and its driver against a fake steppe.

    stepgate_conformance_selftest.py [--cases DIR]       (or: stepgate_conformance.py --self-test [--cases DIR])
    stepgate_conformance_selftest.py fake-steppe ARGS    the fake: `gate FILE --ledger-dir D ... [--http PORT]`
                                                         or `gate --verify FILE`; it only knows gate-retry's run

The fake plays the gate-retry case (greeting must contain inputs.name, one retry) with a hash-chained ledger, so
the harness's stdio and HTTP drivers, reply checks and ledger checks (incl. tampered/dropped copies) run for real.
"""

import argparse
import hashlib
import json
import sys
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stepgate_conformance import (  # noqa: E402
    ApiFixture, ClientSession, McpFixture, check_requests, jcs, load_case, reply_of, run_case, streamable_http_client,
    substitute, types)

GATE_RETRY = """
name: fake gate-retry
stepfile: {stepgate: "1", id: retry, inputs: {type: object}, steps: [{id: greet, instructions: "Greet {{inputs.name}}.",
  produces: {type: object}, gates: [{id: names-them, message: the greeting must contain the name}], retries: 1}]}
inputs: {name: Ada}
actions: [{submit: {greeting: Hello there}}, {submit: {greeting: "Hello, Ada"}}]
expect:
  replies:
    - {state: running, step: greet, contain: Greet Ada.}
    - {state: running, failures: [names-them], contain: the greeting must contain the name}
    - {state: finished}
  ledger: [run_started, step_started, submit, gate, submit, gate, step_passed, run_finished]
"""


def record_hash(record):
    return "sha256:" + hashlib.sha256(jcs(record).encode()).hexdigest()


def fake_steppe(argv):
    """A stand-in for `steppe gate` that serves only gate-retry's run (stdio or --http), or verifies a ledger."""
    if argv[:2] == ["gate", "--verify"]:
        records = [json.loads(line) for line in Path(argv[2]).read_text().splitlines() if line.strip()]
        for i, r in enumerate(records):
            if r.get("seq") != i or r.get("prev") != (record_hash(records[i - 1]) if i else None):
                print(f"{argv[2]}: broken at seq {i}: bad seq or prev")
                return 1
        print(f"{argv[2]}: intact, {len(records)} records")
        return 0
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    parser = argparse.ArgumentParser(prog="fake steppe")
    parser.add_argument("file")
    parser.add_argument("--ledger-dir")
    parser.add_argument("--calls-per-step")
    parser.add_argument("--http", type=int)
    args = parser.parse_args(argv[1:])
    stepfile = json.loads(Path(args.file).read_text())
    step, state = stepfile["steps"][0], {"ledger": [], "attempt": 0}

    def log(kind, **fields):
        prev = record_hash(state["ledger"][-1]) if state["ledger"] else None
        record = {"run": state["run"], "stepfile": stepfile["id"], "seq": len(state["ledger"]), "type": kind,
                  "at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "prev": prev, **fields}
        state["ledger"].append(record)
        Path(args.ledger_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(args.ledger_dir) / f"{stepfile['id']}-{state['run']}.jsonl", "a") as f:
            f.write(jcs(record) + "\n")

    def reply(structured, text, is_error=False):
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=structured,
                                    is_error=is_error)

    async def list_tools(ctx, params):
        names = [stepfile["id"], "stepgate_submit", "stepgate_call"]
        return types.ListToolsResult(tools=[types.Tool(name=n, input_schema={"type": "object"}) for n in names])

    async def call_tool(ctx, params):
        run, gate = state.get("run"), step["gates"][0]
        if params.name == stepfile["id"]:
            state["run"], state["inputs"] = str(uuid.uuid4()), params.arguments
            log("run_started", identity="sha256:0", inputs="sha256:0")
            log("step_started", step=step["id"])
            text = step["instructions"].replace("{{inputs.name}}", params.arguments["name"])
            return reply({"run": state["run"], "state": "running", "step": {"step": step["id"], "instructions": text}},
                         f"Step 1 of 1: {text}")
        if params.name != "stepgate_submit" or params.arguments.get("run") != run:
            return reply({"run": run, "state": "failed", "error": "UnknownTool", "message": params.name},
                         f"UnknownTool: {params.name}", True)
        output, state["attempt"] = params.arguments["output"], state["attempt"] + 1
        passed = state["inputs"]["name"] in output.get("greeting", "")
        log("submit", step=step["id"], attempt=state["attempt"], output={"sha256": "sha256:0", "length": 1})
        log("gate", step=step["id"], attempt=state["attempt"], gate=gate["id"], verdict="pass" if passed else "fail",
            diagnosis=None)
        if passed:
            log("step_passed", step=step["id"], attempt=state["attempt"])
            log("run_finished", outcome="passed")
            return reply({"run": run, "state": "finished", "outputs": {step["id"]: output}}, json.dumps(output))
        failure = {"gate": gate["id"], "diagnosis": gate["message"]}
        return reply({"run": run, "state": "running", "failures": [failure]}, f"{gate['id']}: {gate['message']}", True)

    server = Server("stepgate", on_list_tools=list_tools, on_call_tool=call_tool)
    if args.http:
        import uvicorn

        uvicorn.run(server.streamable_http_app(json_response=True, stateless_http=True), host="127.0.0.1",
                    port=args.http, log_level="warning")
        return 0

    async def serve():
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)
    return 0


async def fixture_problems():
    """Both fixtures, driven with httpx2 and the SDK client."""
    import httpx2

    problems, ok = [], {"status": 200, "json": {"ok": True}}
    api = ApiFixture([
        {"method": "GET", "path": "/items/K-1", "key": {"header": "X-Api-Key", "value": "k"}, "answers": [ok]},
        {"method": "GET", "path": "/busy?x=1", "answers": [{"status": 503, "json": {}}, ok]},
        {"method": "GET", "path": "/moved", "answers": [{"status": 302, "headers": {"location": "http://h:{port}/x"}}]},
        {"method": "POST", "path": "/verify", "answers": [{"status": 200, "json": {"pass": True}}]}])
    mcp = McpFixture({"token": "t-1", "tools": [{"name": "lookup", "inputSchema": {"type": "object"}, "text": "Leeds"}]})
    checks = [("GET", "/items/K-1", {}, 401), ("GET", "/items/K-1", {"X-Api-Key": "k"}, 200),
              ("GET", "/busy?x=2", {}, 404), ("GET", "/busy?x=1", {}, 503), ("GET", "/busy?x=1", {}, 200),
              ("GET", "/busy?x=1", {}, 200), ("GET", "/moved", {}, 302), ("POST", "/verify", {}, 200)]
    try:
        mcp_url = f"http://127.0.0.1:{mcp.port}/mcp"
        async with httpx2.AsyncClient() as http:
            for method, p, headers, status in checks:
                resp = await http.request(method, f"http://127.0.0.1:{api.port}{p}", headers=headers,
                                          json={"a": 1} if method == "POST" else None)
                location = f"http://h:{api.port}/x" if p == "/moved" else None
                if (resp.status_code, resp.headers.get("location")) != (status, location):
                    problems.append(f"{method} {p}: {resp.status_code} {resp.headers.get('location')} {resp.text!r}")
            if resp.json() != {"pass": True}:
                problems.append(f"POST /verify answered {resp.text!r}")
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                resp = await http.post(mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                       headers={"Accept": "application/json, text/event-stream", **headers})
                if resp.status_code != 401:
                    problems.append(f"an MCP request with {headers} answered {resp.status_code}, not 401")
        problems += check_requests([{"method": m, "path": p} for m, p, *_ in checks], api.requests)
        problems += check_requests([{"method": "GET", "path": "/items/K-1", "headers": {"X-API-KEY": "k"}},
                                    {"method": "POST", "path": "/verify", "body": {"a": 1}}], api.requests[1::6])
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer t-1"}) as authed:
            async with streamable_http_client(mcp_url, http_client=authed) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=10) as session:
                    await session.initialize()
                    names = [t.name for t in (await session.list_tools()).tools]
                    got = reply_of(await session.call_tool("lookup", {"q": "Acme"}))
        if (names, got["text"], mcp.calls) != (["lookup"], "Leeds", [{"name": "lookup", "arguments": {"q": "Acme"}}]):
            problems.append(f"MCP fixture: tools {names}, reply {got}, calls {mcp.calls}")
    finally:
        api.close()
        mcp.close()
    return problems


async def driver_problems(tmp):
    """The harness against the fake steppe: gate-retry must pass on both transports, and a wrong case must fail."""
    fake = Path(tmp, "steppe")
    fake.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{Path(__file__).resolve()}' fake-steppe \"$@\"\n")
    fake.chmod(0o755)
    good, bad = Path(tmp, "gate-retry.case.yaml"), Path(tmp, "wrong.case.yaml")
    good.write_text(GATE_RETRY)
    bad.write_text(GATE_RETRY.replace("contain: Greet Ada.", "contain: Greet Bob.").replace("step_passed, ", ""))
    problems = []
    for transport in ("stdio", "http"):
        opts = argparse.Namespace(steppe=str(fake), transport=transport, calls_per_step=8, timeout=30)
        for case, want_ok in ((good, True), (bad, False)):
            work = Path(tmp, f"{transport}-{case.stem}")
            work.mkdir()
            result = await run_case(opts, case, work)
            if result["ok"] != want_ok or (not want_ok and not all(
                    s in result["reason"] for s in ("Greet Bob.", "Step 1 of 1: Greet Ada.", "ledger types"))):
                problems.append(f"{transport} {case.name}: {result}")
    return problems


async def self_test(opts):
    problems = await fixture_problems()
    with tempfile.TemporaryDirectory() as tmp:
        problems += await driver_problems(tmp)
    subs = {"${api.origin}": "http://h:1", "${api.host}": "h:1"}
    if substitute({"u": ["${api.origin}/x", {"${api.host}": 1}]}, subs) != {"u": ["http://h:1/x", {"h:1": 1}]}:
        problems.append("substitute is wrong")
    if jcs({"b": [1.0, "é\n"], "a": None, "é": True, "z": {}}) != '{"a":null,"b":[1,"é\\n"],"z":{},"é":true}':
        problems.append("jcs is wrong")
    for path in sorted(Path(opts.cases).glob("*.case.yaml")) if opts.cases else []:
        try:
            load_case(path)
        except Exception as e:
            problems.append(f"{path.name} does not parse: {e}")
    print("\n".join(["FAIL self-test: " + p for p in problems] or ["ok self-test"]))
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["fake-steppe"]:
        sys.exit(fake_steppe(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="also check that every *.case.yaml here parses")
    sys.exit(anyio.run(self_test, parser.parse_args()))
