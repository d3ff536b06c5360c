#include "server/net_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "server/http_server.h"
#include "util/error.h"

namespace tokenmill::server {

namespace {

bool addr_of(const sockaddr_storage& ss, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  ip = buf;
  return true;
}

}  // namespace

int find_connection_fd(const std::string& remote_addr, int remote_port, int local_port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    int fd = std::atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == dirfd(d)) continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    std::string lip, pip;
    int lport = 0, pport = 0;
    if (!addr_of(local, lip, lport) || !addr_of(peer, pip, pport)) continue;
    if (lport == local_port && pport == remote_port && pip == remote_addr) {
      found = fd;
      break;
    }
  }
  closedir(d);
  return found;
}

bool peer_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
  }
  return false;
}

std::string describe_port_owner(int port) {
  // Socket inodes listening on the port, from /proc/net/tcp and tcp6 (state 0A = LISTEN).
  std::set<std::string> inodes;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ss(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      auto colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;
      if (std::strtol(local.substr(colon + 1).c_str(), nullptr, 16) == port) inodes.insert(inode);
    }
  }
  if (inodes.empty()) return "";
  DIR* proc = opendir("/proc");
  if (!proc) return "";
  std::string result;
  while (dirent* e = readdir(proc)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    std::string fddir = std::string("/proc/") + e->d_name + "/fd";
    DIR* fds = opendir(fddir.c_str());
    if (!fds) continue;
    while (dirent* f = readdir(fds)) {
      char target[256];
      std::string link = fddir + "/" + f->d_name;
      ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = 0;
      std::string t = target;  // "socket:[12345]"
      if (t.rfind("socket:[", 0) == 0 && inodes.count(t.substr(8, t.size() - 9))) {
        std::ifstream comm(std::string("/proc/") + e->d_name + "/comm");
        std::string name;
        std::getline(comm, name);
        std::ifstream cmdline(std::string("/proc/") + e->d_name + "/cmdline");
        std::string cmd((std::istreambuf_iterator<char>(cmdline)),
                        std::istreambuf_iterator<char>());
        for (char& ch : cmd) {
          if (ch == '\0') ch = ' ';
        }
        if (cmd.size() > 120) cmd = cmd.substr(0, 120) + "...";
        result = fmt::format("pid {} ({}: {})", e->d_name, name, cmd);
        break;
      }
    }
    closedir(fds);
    if (!result.empty()) break;
  }
  closedir(proc);
  if (result.empty()) result = "a process this user cannot inspect";
  return result;
}

}  // namespace tokenmill::server
