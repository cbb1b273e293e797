"""Berth REST API v1, mounted at ``/api/v1/`` (schema ``/api/schema/``, Swagger UI ``/api/docs/``).

Scripts authenticate with a token; browsers with their session (CSRF enforced on writes)::

    TOKEN=$(curl -s -X POST localhost:8000/api/v1/auth/token/ -H 'Content-Type: application/json' \\
            -d '{"username": "ada", "password": "..."}' | jq -r .token)
    curl -H "Authorization: Token $TOKEN" 'localhost:8000/api/v1/availability/?gpu_type=A100'\\
'&start=2030-01-01T09:00:00Z&end=2030-01-02T09:00:00Z&step=3600'
    curl -H "Authorization: Token $TOKEN" -H 'Content-Type: application/json' \\
         -X POST localhost:8000/api/v1/bookings/ \\
         -d '{"project": "vision", "gpu_type": "A100", "gpu_count": 2,
              "start_at": "2030-01-01T09:00:00Z", "end_at": "2030-01-01T13:00:00Z"}'

Errors are ``{"message", "fields"}``: 400 bad input (``fields`` names each field), 403 not
allowed, 404 not found or not yours, 409 GPUs taken (plus ``alternatives``: the nearest free
windows), 413 body too large.  Lists use cursor pagination (``next``/``previous`` links,
``page_size`` up to 200).

Every view is an ``<Entity><Action>Api`` class with nested ``InputSerializer`` /
``OutputSerializer`` that parses input, calls one service or selector and renders.
"""
