"""A stand-in for the `claude` CLI that speaks its stream-json protocol.

steppe runs a CLI-backed agent (`@claude/<model>`) as
    claude --print --output-format stream-json --verbose --model M
           (--session-id U | --resume U) ... --mcp-config FILE ...
with the prompt on stdin. This script does what the real CLI does with
that, minus the model: it connects to the MCP server the config names
(steppe's loopback bridge) with the real Python `mcp` client, reports the
session's tools in its init event, calls the bridged tools, and ends with
a `result` event carrying a cost and token usage.

What it does is set by FAKE_CLAUDE_MODE:
    work      write note.txt, run `cat /etc/hostname` if it has a shell, ask
              a question if it may, vote the first verdict if there is a
              verdict tool, then report success
    lie       its init event lists a tool it was not granted (Bash), then
              it hangs: steppe must kill it
    die-once  in a fresh session it writes note.txt and dies without a
              result; resumed (--resume), it finishes as `work` does
    fail      reports an error result (the task failed, not the process)
    die-early its first invocation exits before its init event (a CLI that
              could not start its session); later ones work
Every invocation's argv and stdin are appended to FAKE_CLAUDE_LOG as JSON
lines when it is set.
"""

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def emit(event):
    print(json.dumps(event), flush=True)


def flag(argv, name):
    if name in argv:
        i = argv.index(name)
        if i + 1 < len(argv):
            return argv[i + 1]
    return None


async def main():
    argv = sys.argv[1:]
    prompt = sys.stdin.read()
    mode = os.environ.get("FAKE_CLAUDE_MODE", "work")
    log = os.environ.get("FAKE_CLAUDE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"argv": argv, "stdin": prompt, "api_key": bool(os.environ.get("ANTHROPIC_API_KEY")), "thinking": os.environ.get("MAX_THINKING_TOKENS")}) + "\n")
    if mode == "die-early" and log and not os.path.exists(log + ".died"):
        open(log + ".died", "w").close()
        sys.stderr.write("fake claude: no session today\n")
        return 4
    resumed = flag(argv, "--resume")
    session = resumed or flag(argv, "--session-id")
    model = flag(argv, "--model")
    with open(flag(argv, "--mcp-config")) as f:
        steps = json.load(f)["mcpServers"]["steps"]
    http = create_mcp_http_client(headers=steps.get("headers") or {})
    async with Client(streamable_http_client(steps["url"], http_client=http)) as client:
        tools = (await client.list_tools()).tools
        names = ["mcp__steps__" + t.name for t in tools]
        if mode == "lie":
            names.append("Bash")
        emit({"type": "system", "subtype": "init", "session_id": session, "model": model, "tools": names, "mcp_servers": [{"name": "steps", "status": "connected"}]})
        if mode == "lie":
            await asyncio.sleep(60)
            return 0
        if mode == "fail":
            emit({"type": "result", "subtype": "error_during_execution", "is_error": True, "result": "the task could not be done", "session_id": session, "num_turns": 1, "total_cost_usd": 0.001, "usage": {"input_tokens": 10, "output_tokens": 5}})
            return 0
        turns = 0
        said = []

        async def call(name, args):
            nonlocal turns
            turns += 1
            use_id = f"toolu_{turns}"
            emit({"type": "assistant", "session_id": session, "message": {"role": "assistant", "content": [{"type": "tool_use", "id": use_id, "name": "mcp__steps__" + name, "input": args}], "usage": {"input_tokens": 100, "output_tokens": 20}}})
            result = await client.call_tool(name, args)
            text = "".join(getattr(c, "text", "") for c in result.content)
            emit({"type": "user", "session_id": session, "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id, "content": text}]}})
            return text

        granted = {t.name: t for t in tools}
        if "write_file" in granted and not resumed:
            said.append(await call("write_file", {"path": "note.txt", "content": "written by the cli\n"}))
        if mode == "die-once" and not resumed:
            sys.stderr.write("fake claude: dying on purpose\n")
            return 3
        if "run_shell" in granted:
            shell = json.loads(await call("run_shell", {"command": "cat /etc/hostname"}))
            said.append("shell on " + str(shell.get("stdout", "")).strip())
        if "ask_user" in granted:
            answer = json.loads(await call("ask_user", {"question": "Which colour?", "options": ["teal", "red"]}))
            said.append("colour " + str(answer.get("answer")))
        if "verdict" in granted:
            choices = granted["verdict"].input_schema["properties"]["choice"]["enum"]
            said.append(await call("verdict", {"choice": choices[0], "note": "looked fine"}))
        turns += 1
        final = "done (" + ("resumed" if resumed else "fresh") + "): " + "; ".join(said)
        emit({"type": "assistant", "session_id": session, "message": {"role": "assistant", "content": [{"type": "text", "text": final}], "usage": {"input_tokens": 50, "output_tokens": 10}}})
        emit({"type": "result", "subtype": "success", "is_error": False, "result": final, "session_id": session, "num_turns": turns, "total_cost_usd": 0.0125, "usage": {"input_tokens": 1000, "output_tokens": 200, "cache_read_input_tokens": 400, "cache_creation_input_tokens": 0}})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
