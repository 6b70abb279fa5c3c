"""Run inside one "host": ask a server's routes with and without the run secret and print each status as JSON.

    python probe.py URL        (the secret, if any, in MEGATRON_RL_RUN_SECRET)
"""

import json
import os
import sys
import urllib.error
import urllib.request

ROUTES = [("GET", "/health"), ("GET", "/v1/models"), ("POST", "/collective_rpc"), ("POST", "/pause"),
          ("POST", "/update_weight_version"), ("GET", "/server_info")]


def status(url: str, method: str, path: str, secret: str | None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {secret}"} if secret else {})}
    body = b"{}" if method == "POST" else None
    request = urllib.request.Request(url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def main(url: str) -> None:
    secret = os.environ.get("MEGATRON_RL_RUN_SECRET")
    plain = {path: status(url, method, path, None) for method, path in ROUTES}
    # with the secret only a harmless read: the run's own calls (pause, weight stages) are the run's to make
    guarded = {"/v1/models": status(url, "GET", "/v1/models", secret)}
    print(json.dumps({"plain": plain, "with_secret": guarded}))


if __name__ == "__main__":
    main(sys.argv[1])
