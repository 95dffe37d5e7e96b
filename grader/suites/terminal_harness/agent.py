"""A minimal terminal agent: the model proposes one shell command per turn, this program runs it in the working
directory and sends the output back, until the model answers DONE or the turns run out.

Standard library only (the sandbox has Python 3.11 and no packages). Reads the task's instruction on stdin; the model
endpoint comes from ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL``; ``CRUCIBLE_MAX_TURNS`` caps the
turns (the endpoint refuses calls past it anyway). Every turn is logged on stderr.
"""

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

SYSTEM = (
    "You are an expert at the Linux command line, working in a shell whose current directory is /app. "
    "Solve the task. Each reply is exactly one shell command in a ```bash code block; you will see its output. "
    "When the task is complete, reply with DONE and nothing else."
)
OUTPUT_CHARS = 2000
COMMAND_TIMEOUT_S = 30
FENCE = re.compile(r"```(?:bash|sh|shell)?\s*\n(.*?)```", re.DOTALL)


def complete(messages: list) -> str:
    body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": messages, "temperature": 0.0}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["choices"][0]["message"]["content"] or ""


def command_of(reply: str) -> str | None:
    """The command in ``reply``: its first fenced block, else its first non-empty line; ``None`` for DONE."""
    if reply.strip().upper().startswith("DONE"):
        return None
    fenced = FENCE.search(reply)
    if fenced:
        return fenced.group(1).strip() or None
    lines = [line.strip().strip("`$ ") for line in reply.splitlines() if line.strip()]
    return lines[0] if lines else None


def run(command: str) -> str:
    try:
        done = subprocess.run(["bash", "-c", command], capture_output=True, timeout=COMMAND_TIMEOUT_S, cwd="/app")
        output = (done.stdout + done.stderr).decode("utf-8", "replace")
        status = f"exit code {done.returncode}"
    except subprocess.TimeoutExpired:
        output, status = "", f"timed out after {COMMAND_TIMEOUT_S} s"
    if len(output) > OUTPUT_CHARS:
        output = output[:OUTPUT_CHARS // 2] + "\n[... output cut ...]\n" + output[-OUTPUT_CHARS // 2:]
    return f"({status})\n{output}"


def main() -> int:
    instruction = sys.stdin.read()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    for turn in range(int(os.environ.get("CRUCIBLE_MAX_TURNS", "10"))):
        try:
            reply = complete(messages)
        except urllib.error.HTTPError as exc:
            print(f"turn {turn}: the model endpoint answered {exc.code}: {exc.read()[:500]!r}", file=sys.stderr)
            return 0
        messages.append({"role": "assistant", "content": reply})
        command = command_of(reply)
        print(f"turn {turn}: {command!r}", file=sys.stderr)
        if command is None:
            return 0
        messages.append({"role": "user", "content": run(command)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
