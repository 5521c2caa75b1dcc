# Helpers shared by up.sh, down.sh and .ci/run (source it; it defines functions only).

# identity PID: "PID STARTTIME", which tells a recorded process from a later one with its PID.
identity() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) && read -ra s <<<"${s##*) }" && echo "$1 ${s[19]}"; }

# alive PID: the process exists and is not a zombie.
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) && [[ ${s##*) } != Z* ]]; }

# listeners: "PORT INODE" for every listening TCP socket (IPv4 and IPv6), from /proc/net.
listeners() {
  local f sl local_addr rem st rest
  for f in /proc/net/tcp /proc/net/tcp6; do
    [[ -r $f ]] || continue
    while read -r sl local_addr rem st rest; do
      [[ $st == 0A ]] || continue
      read -r _ _ _ _ _ inode _ <<<"$rest"
      echo "$((16#${local_addr##*:})) $inode"
    done < <(tail -n +2 "$f")
  done | sort -n -u
}

# listener_pid PORT: the PID of a process holding a socket that listens on PORT, or nothing.
listener_pid() {
  local port inode
  while read -r port inode; do
    [[ $port == "$1" ]] || continue
    find /proc/[0-9]*/fd -lname "socket:\[$inode\]" 2>/dev/null | head -n 1 | cut -d/ -f3
    return
  done < <(listeners)
}
