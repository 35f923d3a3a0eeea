import socket
s=socket.socket(socket.AF_UNIX); s.connect("/data/admin.sock"); s.send(b"hello from sandbox"); print("sandbox got:", s.recv(100))
