// Package link is mqlet's MQTT connection: one link to one broker, protocol-agnostic (it knows
// nothing of mqlet's topics or payloads). It owns the connect loop with jittered back-off, the
// subscriptions, an inbox that never blocks the MQTT client, PUBACK receipts for publishes, and
// the liveness pair (a retained online message and a Last Will) that carry a session number.
//
// Nothing here is a queue anyone relies on: a publish made while the link is down fails at once,
// an inbox overflow drops messages (and says so), and paho runs with no persistent store. The
// caller's bbolt outbox and the level-based desired state (a full resend via Resubscribe) carry
// correctness, as shared/design.md asks.
//
// # What paho v1.5.1 does, read from its source
//
// Message ids (messageids.go): one map per client from id to token, shared by PUBLISH,
// SUBSCRIBE and UNSUBSCRIBE. getID hands out lastIssuedID+1 (skipping 0 and ids still in the
// map, wrapping at 65535), so an id is unique among a client's in-flight packets and is only
// reused after freeID, which runs after the PUBACK (or SUBACK, UNSUBACK) for it was handled.
//
// Put and Del (client.go Publish, store.go persistOutbound/persistInbound, net.go):
//   - Publish with QoS 1 takes an id, sets pub.MessageID, then calls Put("o.<id>", pub)
//     synchronously in the publishing goroutine, BEFORE handing the packet to the writer
//     goroutine. So Put always precedes the PUBACK, and Publish returns after Put. The packet's
//     Payload is the caller's []byte itself (no copy) when the payload is a []byte.
//   - When a PUBACK arrives the reader goroutine calls persistInbound, which calls
//     Del("o.<id>"), and only then completes the token and frees the id. Del("o.<id>") also runs
//     for SUBACK and UNSUBACK (same key space); with ResumeSubs off SUBSCRIBE and UNSUBSCRIBE are
//     never Put, so such a Del finds no receipt.
//   - Inbound QoS 1 publishes are Put as "i.<id>" and Del'd when paho sends our PUBACK; PUBACKs we
//     send go through persistOutbound with QoS 0, which only Dels the "i." key.
//   - Connect calls Open; with CleanSession it calls Reset AFTER the connection is up, the status is
//     "connected" and the OnConnect handler was started, i.e. concurrently with anything the
//     handler publishes. A Reset that failed receipts could therefore fail a publish that goes on
//     to be acknowledged; this store's Reset does nothing (each client is new, so there is nothing
//     to forget).
//   - Close is called when Connect fails and by Disconnect after every comms goroutine of the
//     client has stopped (client.disconnect); a lost connection (AutoReconnect off) instead ends
//     with the OnConnectionLost handler, also after the comms goroutines stopped. Either one is
//     this package's signal that paho is done with a connection.
//   - Get and All are only used by resume (CleanSession off) and reserveStoredPublishIDs
//     (ConnectRetry on); neither runs here, so the store keeps no packets at all.
//
// Why the paho token is not the receipt: a PublishToken is completed by the PUBACK, but also
// with no error when its id is claimed again (claimID, on resume), for QoS 0 while reconnecting,
// and it is left pending when Publish merely stored the packet (status connecting, reconnecting
// or disconnecting). With the options used here (AutoReconnect off, CleanSession on) paho v1.5.1
// does set an error on a lost connection (messageIds.cleanUp: "connection lost before Publish
// completed"), but that is an accident of the option set, not a contract. A Receipt completes
// with nil only from Del of the key Put for that very publish, and fails with ErrConnectionLost
// when the connection ends first (OnConnectionLost, or Close after Disconnect).
//
// Matching Put to a Receipt without a race: Publish copies the payload into a fresh buffer with
// capacity at least 1, registers the receipt under the address of that buffer's first byte, then
// calls paho's Publish. Put finds the receipt by the packet's Payload address (the same backing
// array) and moves it to a map keyed by message id, all before the packet can reach the wire.
//
// Reading: packets.ReadPacket allocates a packet's whole remaining length as soon as it has read
// the fixed header, up to 256 MiB. With Options.MaxPayload set, the connection paho reads from is
// opened here (SetCustomOpenConnectionFn, dialing as paho's own openConnection does) and wrapped
// above TLS and websockets in a reader that follows the MQTT framing and fails the read that would
// complete an oversized header (framing.go): paho never sees that length.
//
// Other pitfalls this package defeats: the message handler only does a non-blocking send to the
// inbox (a blocking handler stalls paho's router and the connection with it); subscriptions are
// made in the OnConnect handler of each client (paho would forget them on reconnect); AutoReconnect
// is off and Run creates a new paho client per attempt, so each connection has its own Will with
// its own session number and paho queues nothing while disconnected.
package link
