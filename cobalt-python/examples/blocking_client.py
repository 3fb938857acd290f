"""A script without asyncio: the blocking client.

    python examples/blocking_client.py coap://127.0.0.1
"""

import sys

import cobalt.blocking

base = sys.argv[1] if len(sys.argv) > 1 else "coap://127.0.0.1"
print(cobalt.blocking.get(f"{base}/hello?name=script").text)
print(cobalt.blocking.get(f"{base}/.well-known/core").text)
with cobalt.blocking.observe(f"{base}/temp") as observation:
    for notification, _ in zip(observation, range(3)):
        print("temperature", notification.text)
