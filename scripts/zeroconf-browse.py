#!/usr/bin/env python3
# Browses _ferry._tcp with python-zeroconf bound to 127.0.0.1 (never a real interface) until
# a service whose TXT id equals ARGV[1] appears, or ARGV[2] seconds pass. Prints what it saw.
# Exit 0 when found. Used by the discovery tests as an mDNS client independent of avahi.
import sys, time
from zeroconf import Zeroconf, ServiceBrowser, ServiceListener
found = {}
class L(ServiceListener):
    def add_service(self, zc, t, name):
        info = zc.get_service_info(t, name, timeout=3000)
        if info: found[name] = {k.decode(): (v.decode() if v else None) for k, v in info.properties.items()}
    def update_service(self, zc, t, name): self.add_service(zc, t, name)
    def remove_service(self, zc, t, name): pass
zc = Zeroconf(interfaces=["127.0.0.1"])
ServiceBrowser(zc, "_ferry._tcp.local.", L())
deadline = time.time() + float(sys.argv[2])
while time.time() < deadline:
    if any(p.get("id") == sys.argv[1] for p in found.values()): break
    time.sleep(0.1)
zc.close()
print(found)
sys.exit(0 if any(p.get("id") == sys.argv[1] for p in found.values()) else 1)
