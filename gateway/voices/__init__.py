"""Uploaded reference voices: the catalog shared by HTTP and WebSocket, the
persistent store under ``data_dir`` and the multipart upload forms."""
