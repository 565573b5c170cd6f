# Sourced by scripts/avahi-loopback.sh and Integration/lab/lab.sh: the one avahi-daemon
# configuration the tests run, confined to one interface.
#
#   avahi_conf FILE HOST-NAME INTERFACE
#
# mDNS stays on INTERFACE (allow-interfaces), IPv4 only, no wide-area, no reflector,
# nothing published about the host but its address; the rate limit is raised so that
# tests that restart nodes quickly are not throttled.
avahi_conf() {
    cat > "$1" <<CONF
[server]
host-name=$2
use-ipv4=yes
use-ipv6=no
allow-interfaces=$3
enable-dbus=yes
ratelimit-interval-usec=1000000
ratelimit-burst=1000
[wide-area]
enable-wide-area=no
[publish]
publish-hinfo=no
publish-workstation=no
publish-addresses=yes
publish-aaaa-on-ipv4=no
[reflector]
enable-reflector=no
CONF
}
