"""``python -m posttrain.platform.serving --model DIR --port 8000 --tier fast``: the embedded engine server."""

from posttrain.platform.serving.server import main

main()
