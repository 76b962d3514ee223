# Runs a command on a pseudo-terminal (so isTTY is true for its stdin/stdout/stderr), answers a
# prompt once it appears, and reports {"code", "output"} as JSON. Used by the delete prompt test.
# usage: pty_run.py PROMPT_SUBSTRING ANSWER -- CMD ARGS...
import json, os, pty, select, sys, time

def main():
    sep = sys.argv.index('--')
    prompt, answer = sys.argv[1], sys.argv[2]
    cmd = sys.argv[sep + 1:]
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(cmd[0], cmd)
    out = b''
    answered = False
    deadline = time.time() + 60
    while time.time() < deadline:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if not answered and prompt.encode() in out:
            os.write(fd, answer.encode() + b'\r')
            answered = True
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    print(json.dumps({'code': code, 'answered': answered, 'output': out.decode('utf8', 'replace')}))

main()
