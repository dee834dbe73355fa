"""A TCP way to the test server whose network the test can cut without a reset.

The test server listens on a Unix socket only. :class:`Proxy` listens on a TCP port of
127.0.0.1 and forwards each connection to that socket, until :meth:`Proxy.cut`: from then on
every connection it has forwarded goes silent for good, and every new one is accepted and never
answered, until :meth:`Proxy.heal` (after which new connections work again; the old ones stay
silent); :meth:`Proxy.refuse` has new connections refused instead, and
:meth:`Proxy.drop_answers` loses only what the server sends. Nothing else is closed or
reset, so a client sees what it sees when a NAT or a firewall forgets its connections, or a
server's host drops off the network: calls that are never answered, connects that never
complete. Data the client sends is accepted by this process's sockets (acknowledged), so only
the client's own clocks can tell.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class Proxy:
    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        #: Bumped by each cut: a connection forwards only while the epoch it began in lasts.
        self._epoch = 0
        self._down = False
        #: The server's answers are dropped (each way's bytes are read and thrown away).
        self._mute = False
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname}"

    def cut(self) -> None:
        """Every connection forwarded so far goes silent for good; new ones are not answered."""
        with self._lock:
            self._epoch += 1
            self._down = True

    def drop_answers(self) -> None:
        """What clients send still reaches the server, and the server's answers are lost (a
        network that fails one way): a call is carried out, its answer never arrives."""
        with self._lock:
            self._mute = True

    def refuse(self) -> None:
        """Stop listening: new connections are refused at once (a firewall that rejects, a host
        that is unreachable), as the old ones stay silent. For good: there is no way back."""
        # Shut down first: a close alone leaves the socket listening under the thread that
        # waits in accept(), and new connections queue there unanswered instead.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def heal(self) -> None:
        """New connections are forwarded again (those of before the cut stay silent), and the
        server's answers too."""
        with self._lock:
            self._down = False
            self._mute = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _live(self, epoch: int, answer: bool) -> bool:
        with self._lock:
            if answer and self._mute:
                return False
            return not self._closed and not self._down and epoch == self._epoch

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._sockets.append(client)
                down, epoch = self._down, self._epoch
            if down:
                continue  # accepted, kept open, never answered
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self.unix_path)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.append(server)
            for source, sink, answer in ((client, server, False), (server, client, True)):
                threading.Thread(
                    target=self._pump,
                    args=(source, sink, epoch, answer),
                    name="proxy-pump",
                    daemon=True,
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, epoch: int, answer: bool) -> None:
        """Forward source to sink while the connection's epoch lasts; after a cut, read and drop
        (the bytes are acknowledged, never delivered), and never close either side."""
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                if self._live(epoch, answer):
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)
                return
            if self._live(epoch, answer):
                try:
                    sink.sendall(data)
                except OSError:
                    return
