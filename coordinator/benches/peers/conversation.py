"""One scripted conversation as a peer's task runs it: the chat loop an agent step holds, in Python.

Posts the conversation so far with the offered tools to the model, runs each
tool it calls (list_dir, read_file, search_files, on the task's directory) and
sends the results back, until the model answers without calling; returns the
transcript. `run` for threads (requests), `run_async` for an event loop (aiohttp).
"""

import fnmatch
import json
import os


def tool(name, args):
    try:
        if name == "list_dir":
            return {"entries": sorted(os.listdir(args.get("path") or "."))}
        if name == "read_file":
            with open(args["path"]) as f:
                return {"content": f.read()}
        if name == "search_files":
            pattern = args.get("pattern", "")
            return {"matches": [p for p in sorted(os.listdir(".")) if fnmatch.fnmatch(p, f"*{pattern}*")]}
        return {"error": f"no tool {name}"}
    except OSError as e:
        return {"error": f"{name}: {e}"}


def answered(messages, reply):
    """Appends the model's reply and its tools' results; whether it called any."""
    msg = reply["choices"][0]["message"]
    messages.append(msg)
    calls = msg.get("tool_calls") or []
    for c in calls:
        result = tool(c["function"]["name"], json.loads(c["function"].get("arguments") or "{}"))
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(result)})
    return bool(calls)


_local = None


def run(url, tools, i, turns=8):
    import threading

    import requests

    global _local
    if _local is None:
        _local = threading.local()
    session = getattr(_local, "session", None) or requests.Session()
    _local.session = session
    messages = [{"role": "user", "content": f"Conversation {i}."}]
    for _ in range(turns):
        r = session.post(url, json={"model": "x/y", "messages": messages, "tools": tools}, timeout=600)
        r.raise_for_status()
        if not answered(messages, r.json()):
            break
    return messages


async def run_async(session, url, tools, i, turns=8):
    messages = [{"role": "user", "content": f"Conversation {i}."}]
    for _ in range(turns):
        async with session.post(url, json={"model": "x/y", "messages": messages, "tools": tools}) as r:
            r.raise_for_status()
            reply = await r.json()
        if not answered(messages, reply):
            break
    return messages
