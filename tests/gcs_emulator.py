"""gcp-storage-emulator on 127.0.0.1, in memory, with one bucket, as GCS answers tensorstore.

GCS sends an object's generation in the `x-goog-generation` header of a media download;
tensorstore (orbax's array writes) refuses a read without it ("Malformed StorageGeneration").
The emulator puts the generation only in the object's JSON, so its download handler is
wrapped to send the header too. It serves one request at a time, and a client that holds a
request open (libcurl's uploads) stalls every other process of a test: so each request gets
a thread, as on GCS. Preconditions (ifGenerationMatch) are not emulated: each run of the
tests writes a folder of its own.

    python tests/gcs_emulator.py PORT BUCKET
"""

import sys
from http import server

from gcp_storage_emulator.handlers import objects


def _download_with_generation(request, response, storage, *args, **kwargs):
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
    except Exception:  # noqa: BLE001 - a missing object: the handler answers 404 itself
        pass
    return _download(request, response, storage, *args, **kwargs)


_download, objects.download = objects.download, _download_with_generation

if __name__ == "__main__":
    from gcp_storage_emulator.server import create_server  # routes bind the wrapped handler

    server.HTTPServer = server.ThreadingHTTPServer

    port, bucket = int(sys.argv[1]), sys.argv[2]
    create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()
