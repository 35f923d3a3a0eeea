# skillbox's egress bridge under gVisor (crates/skillbox-docker/src/bridge.rs): gVisor's
# network stack is its own, so the proxy cannot listen in the sandbox's loopback from the
# host. This listens there instead (as root, which the sandbox's user cannot signal,
# trace or write to) and carries each connection over its stdin/stdout to skillbox, which
# hands it to the sandbox's proxy. It decides nothing: every connection still meets the
# proxy's rules on the host side, so a bridge the sandbox could subvert would only reach
# what the proxy already lets it reach.
#
# Frames, both ways: stream id (u32), kind (u8), length (u32), payload (big-endian).
# Kinds: 0 ready (to skillbox, once listening; its pid), 1 open (a new connection), 2 data,
# 3 eof (no more data from this side), 4 close (the stream is done: from skillbox,
# after what it sent is delivered), 5 credit (a u32:
# bytes delivered, which the other side may send again). Each side sends a stream at
# most WINDOW bytes beyond what the other has credited (a data frame from here counts at
# least MIN_COST), so a connection that is slow to read holds back only itself.
import os
import select
import socket
import struct
import sys

HEADER = struct.Struct(">IBI")
CREDIT_PAYLOAD = struct.Struct(">I")
READY, OPEN, DATA, EOF, CLOSE, CREDIT = range(6)
MAX_STREAMS = 128
WINDOW = 256 * 1024
MIN_COST = 1024
# Credit is sent back once this much is delivered (or the stream's bytes are all out).
CREDIT_STEP = 32 * 1024
# Past this much not yet written to skillbox, the sockets are not read.
OUT_HIGH = 1 << 20


class Stream:
    __slots__ = ("sock", "pending", "shut", "read_done", "write_done", "window", "delivered")

    def __init__(self, sock):
        self.sock = sock
        self.pending = bytearray()
        self.shut = False
        self.read_done = False
        self.write_done = False
        # What may still be sent to skillbox; what went to the socket, not credited yet.
        self.window = WINDOW
        self.delivered = 0


def main():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(sys.argv[1])))
    listener.listen(128)
    listener.setblocking(False)
    os.set_blocking(0, False)
    os.set_blocking(1, False)
    # Its pid, which the reset spares (seen from inside, as the reset sees it).
    me = str(os.getpid()).encode()
    out = bytearray(HEADER.pack(0, READY, len(me)) + me)
    inbuf = bytearray()
    streams = {}
    by_sock = {}
    next_id = 1

    def send(sid, kind, payload=b""):
        out.extend(HEADER.pack(sid, kind, len(payload)))
        out.extend(payload)

    def drop(sid):
        stream = streams.pop(sid, None)
        if stream is not None:
            by_sock.pop(stream.sock, None)
            stream.sock.close()

    while True:
        readers = [0, listener]
        if len(out) < OUT_HIGH:
            readers += [s.sock for s in streams.values() if not s.read_done and s.window >= MIN_COST]
        writers = [s.sock for s in streams.values() if s.pending or (s.shut and not s.write_done)]
        if out:
            writers.append(1)
        readable, writable, _ = select.select(readers, writers, [])
        if 1 in writable:
            try:
                n = os.write(1, out)
            except BlockingIOError:
                n = 0
            del out[:n]
        if 0 in readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return
            inbuf.extend(chunk)
            while len(inbuf) >= HEADER.size:
                sid, kind, length = HEADER.unpack_from(inbuf)
                if len(inbuf) < HEADER.size + length:
                    break
                payload = bytes(inbuf[HEADER.size : HEADER.size + length])
                del inbuf[: HEADER.size + length]
                stream = streams.get(sid)
                if stream is None:
                    continue
                if kind == DATA:
                    stream.pending.extend(payload)
                elif kind == EOF:
                    stream.shut = True
                elif kind == CLOSE:
                    # skillbox is done with it: what it sent is still delivered, then
                    # the socket closes.
                    stream.shut = True
                    stream.read_done = True
                    if not stream.pending:
                        drop(sid)
                elif kind == CREDIT and length == CREDIT_PAYLOAD.size:
                    stream.window = min(WINDOW, stream.window + CREDIT_PAYLOAD.unpack(payload)[0])
        if listener in readable:
            try:
                sock, _ = listener.accept()
            except OSError:
                sock = None
            if sock is not None:
                if len(streams) >= MAX_STREAMS:
                    sock.close()
                else:
                    sock.setblocking(False)
                    sid = next_id
                    next_id += 1
                    streams[sid] = Stream(sock)
                    by_sock[sock] = sid
                    send(sid, OPEN)
        for sock in writable:
            sid = by_sock.get(sock)
            if sid is None:
                continue
            stream = streams[sid]
            try:
                if stream.pending:
                    n = sock.send(stream.pending)
                    del stream.pending[:n]
                    stream.delivered += n
                    if stream.delivered >= CREDIT_STEP or not stream.pending:
                        send(sid, CREDIT, CREDIT_PAYLOAD.pack(stream.delivered))
                        stream.delivered = 0
                if not stream.pending and stream.shut and not stream.write_done:
                    sock.shutdown(socket.SHUT_WR)
                    stream.write_done = True
            except BlockingIOError:
                pass
            except OSError:
                send(sid, CLOSE)
                drop(sid)
                continue
            if stream.write_done and stream.read_done:
                drop(sid)
        for sock in readable:
            sid = by_sock.get(sock)
            if sid is None:
                continue
            stream = streams[sid]
            try:
                data = sock.recv(min(1 << 16, stream.window))
            except BlockingIOError:
                continue
            except OSError:
                send(sid, CLOSE)
                drop(sid)
                continue
            if data:
                stream.window -= max(len(data), MIN_COST)
                send(sid, DATA, data)
            else:
                stream.read_done = True
                send(sid, EOF)
                if stream.write_done:
                    drop(sid)


main()
