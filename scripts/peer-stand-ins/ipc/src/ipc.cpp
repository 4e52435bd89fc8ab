// See include/ipc/ipc.h: XSched's channels on abstract Unix datagram
// sockets, named by the user and the channel's number (the abstract
// namespace is shared by every user of the machine).
#include "ipc/ipc.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace ipc {
namespace {

socklen_t AddressOf(ChannelKey key, sockaddr_un *address)
{
    std::memset(address, 0, sizeof(*address));
    address->sun_family = AF_UNIX;
    // sun_path[0] stays 0: an abstract name.
    int length = std::snprintf(address->sun_path + 1, sizeof(address->sun_path) - 1,
                               "xsched-ipc-%u-%llu", static_cast<unsigned>(getuid()),
                               static_cast<unsigned long long>(key));
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length);
}

} // namespace

Node::Node(ChannelKey key, NodeType type) : key_(key), type_(type)
{
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0 || type_ != NodeType::kReceiver) return;
    sockaddr_un address;
    socklen_t length = AddressOf(key_, &address);
    if (bind(fd_, reinterpret_cast<sockaddr *>(&address), length) != 0) {
        std::fprintf(stderr, "ipc stand-in: channel %llu: bind: %s\n",
                     static_cast<unsigned long long>(key_), std::strerror(errno));
        close(fd_);
        fd_ = -1;
    }
}

Node::~Node()
{
    if (fd_ >= 0) close(fd_);
}

bool Node::Send(const void *data, std::size_t size)
{
    if (fd_ < 0) return false;
    sockaddr_un address;
    socklen_t length = AddressOf(key_, &address);
    while (true) {
        ssize_t sent = sendto(fd_, data, size, 0, reinterpret_cast<sockaddr *>(&address), length);
        if (sent == static_cast<ssize_t>(size)) return true;
        if (sent < 0 && errno == EINTR) continue;
        return false;
    }
}

std::shared_ptr<Message> Node::Receive()
{
    if (fd_ < 0) return nullptr;
    while (true) {
        // The next datagram's length, without taking it.
        ssize_t length = recv(fd_, nullptr, 0, MSG_PEEK | MSG_TRUNC);
        if (length < 0 && errno == EINTR) continue;
        // 0: shut down by Remove (XSched sends no empty messages).
        if (length <= 0) return nullptr;
        std::vector<char> bytes(static_cast<std::size_t>(length));
        ssize_t got = recv(fd_, bytes.data(), bytes.size(), 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return nullptr;
        bytes.resize(static_cast<std::size_t>(got));
        return std::make_shared<Message>(std::move(bytes));
    }
}

void Node::Remove()
{
    // Shut down, not closed: a Receive blocked in another thread wakes and
    // returns nullptr, and the descriptor is not reused under it.
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

void Channel::Remove(ChannelKey) {}

} // namespace ipc
