// A stand-in for XSched's `ipc` submodule (XpuOS/ipc), whose pinned commit
// is in no public repository. Written here, for scripts/build-peers.sh: it
// offers the calls XSched makes and nothing else (a node that sends to or
// receives from a numbered channel, and removing a channel), on abstract
// Unix datagram sockets, one per receiving channel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ipc {

using ChannelKey = std::uint64_t;

enum class NodeType { kSender, kReceiver };

// One received message.
class Message {
public:
    explicit Message(std::vector<char> bytes) : bytes_(std::move(bytes)) {}
    const void *Data() const { return bytes_.data(); }
    std::size_t Size() const { return bytes_.size(); }

private:
    std::vector<char> bytes_;
};

class Node {
public:
    // A receiver binds the channel `key` (one receiver per channel); a
    // sender sends to whichever receiver holds it.
    Node(ChannelKey key, NodeType type);
    ~Node();
    Node(const Node &) = delete;
    Node &operator=(const Node &) = delete;

    // False when no receiver holds the channel, or the node was removed.
    bool Send(const void *data, std::size_t size);
    // Blocks for the next message; nullptr once the node is removed (also
    // from another thread, which wakes a blocked call) or on an error.
    std::shared_ptr<Message> Receive();
    void Remove();

private:
    ChannelKey key_;
    NodeType type_;
    int fd_ = -1;
};

struct Channel {
    // Nothing outlives its socket here: abstract sockets leave no file.
    static void Remove(ChannelKey key);
};

} // namespace ipc
