"""action=serve: the HTTP app and the predictor behind it (app.py), requests and their checks
(requests.py), the micro-batcher (batcher.py), the connection guard (guard.py)."""
