"""Calls tools of a stdio MCP server in order: `mcp_calls.py CALLS.json [--elicit A,B…] -- COMMAND…`; prints each reply as a JSON line.

With --elicit the client offers form elicitation and answers each request with the next
answer (`accept`, `decline`, `decline:REASON` or `cancel`), printing what it was asked."""

import json
import sys

import anyio
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client


async def main(calls, command, answers):
    params = StdioServerParameters(command=command[0], args=command[1:])

    async def elicit(context, params):
        print(json.dumps({"elicited": params.message}))
        action, _, reason = (answers.pop(0) if answers else "cancel").partition(":")
        return types.ElicitResult(action=action, content={"reason": reason} if reason else None)

    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, elicitation_callback=elicit if answers is not None else None) as session:
            init = await session.initialize()
            print(json.dumps({"server": init.server_info.name, "instructions": init.instructions}))
            listed = await session.list_tools()
            print(json.dumps({"tools": [t.name for t in listed.tools]}))
            for call in calls:
                r = await session.call_tool(call["tool"], call.get("arguments") or {})
                text = "\n".join(c.text for c in r.content if getattr(c, "type", None) == "text")
                print(json.dumps({"text": text, "structured": r.structured_content, "is_error": bool(r.is_error)}))


if __name__ == "__main__":
    sep = sys.argv.index("--")
    own = sys.argv[2:sep]
    answers = own[own.index("--elicit") + 1].split(",") if "--elicit" in own else None
    anyio.run(main, json.loads(open(sys.argv[1]).read()), sys.argv[sep + 1:], answers)
