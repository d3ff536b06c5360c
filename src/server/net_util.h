// Socket helpers for the HTTP layer: find the socket of a connection from its addresses, and
// notice a peer that went away without reading or writing. Internal to server/.
#pragma once

#include <string>

namespace tokenmill::server {

// The fd in this process whose local port is `local_port` and whose peer is
// remote_addr:remote_port; -1 if none.
int find_connection_fd(const std::string& remote_addr, int remote_port, int local_port);

// True when the peer closed or reset the connection (pending unread input counts as alive).
bool peer_gone(int fd);

}  // namespace tokenmill::server
