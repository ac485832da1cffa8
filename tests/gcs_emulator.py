"""gcp-storage-emulator on 127.0.0.1, in memory, with one bucket, as GCS answers tensorstore.

GCS sends an object's generation in the `x-goog-generation` header of a media download;
tensorstore (orbax's array writes) refuses a read without it ("Malformed StorageGeneration").
The emulator puts the generation only in the object's JSON, so its download handler is
wrapped to send the header too. It serves one request at a time, and a client that holds a
request open (libcurl's uploads) stalls every other process of a test: so each request gets
a thread, as on GCS. The emulator's storage is not thread-safe (a DELETE beside a write
raised "dictionary changed size during iteration", the client retried a finished upload and
got 404), so each handler reads its request's body first and then runs under one lock; and
the in-memory server skips rewriting its whole index as JSON after every write (it is read
only when a server starts on disk). Preconditions (ifGenerationMatch) are not emulated: each
run of the tests writes a folder of its own.

    python tests/gcs_emulator.py PORT BUCKET
"""

import sys
import threading
from http import server

from gcp_storage_emulator.handlers import objects
from gcp_storage_emulator.storage import Storage


def _download_with_generation(request, response, storage, *args, **kwargs):
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
    except Exception:  # noqa: BLE001 - a missing object: the handler answers 404 itself
        pass
    return _download(request, response, storage, *args, **kwargs)


_download, objects.download = objects.download, _download_with_generation
_LOCK = threading.RLock()  # a handler may call another through the module


def _one_at_a_time(handler):
    def handle(request, response, storage, *args, **kwargs):
        request.data  # noqa: B018 - read the body outside the lock: a slow client stalls no one
        with _LOCK:
            return handler(request, response, storage, *args, **kwargs)
    return handle


def _serialize_handlers(routes):
    for _, handlers in routes:
        for method, handler in handlers.items():
            handlers[method] = _one_at_a_time(handler)
    objects.insert = _one_at_a_time(objects.insert)  # the router's fallback for bare uploads


Storage._write_config_to_file = lambda self: None

if __name__ == "__main__":
    from gcp_storage_emulator import server as emulator  # routes bind the wrapped download

    _serialize_handlers(emulator.HANDLERS)

    server.HTTPServer = server.ThreadingHTTPServer

    port, bucket = int(sys.argv[1]), sys.argv[2]
    emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()
