# Shared by the bench scripts (sourced): small helpers, nothing that runs on its own.

# A TCP port free on 127.0.0.1 now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The runtime image skillbox's docker backend uses, as `doctor` reports it; empty when
# there is no daemon or no image. Arguments: the skillbox binary, its data dir.
runtime_image() {
  "$1" --data-dir "$2" doctor --json | python3 -c '
import json, sys
for b in json.load(sys.stdin)["backends"]:
    if b["name"] == "docker" and b["available"]:
        print(b["layers"]["image"]["detail"].split()[0])'
}
