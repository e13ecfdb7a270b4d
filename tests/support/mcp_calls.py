"""Calls tools of a stdio MCP server in order: `mcp_calls.py CALLS.json -- COMMAND…`; prints each reply as a JSON line."""

import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client


async def main(calls, command):
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
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
    anyio.run(main, json.loads(open(sys.argv[1]).read()), sys.argv[sep + 1:])
