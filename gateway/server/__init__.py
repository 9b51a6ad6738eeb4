"""The serving process: ``dpgate serve``'s runner (gunicorn or waitress) and its workers.

    serve.py          builds the app in each worker, starts the PostgreSQL front end's
                      process, the metrics directory shared by the workers
    serve_workers.py  gunicorn's threaded worker that balances connections across workers

Above both front ends (gateway/http/, gateway/pgwire/): only the CLI imports it.
"""
