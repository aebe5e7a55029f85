// Package sync will hold mqlet's MQTT side: the topic contract, connect/reconnect, the downlink of
// desired state and the uplink of status, heartbeats and events with the offline outbox. Nothing in
// it may import containerd, and nothing in agent/ may import paho (see shared/design.md).
//
// It is empty until the MQTT work lands; the agent runs standalone (manifest dir only) meanwhile.
package sync
