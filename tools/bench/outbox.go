package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/link"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/uplink"
	v1 "k8s.io/api/core/v1"
)

// outboxPods is how many pod statuses the outbox figure drains.
const outboxPods = 200

// outboxTarget bounds outbox_fsyncs_per_status: bbolt commits per drained status.
const outboxTarget = 0.2

// outboxRun is what the outbox figure saw, for the table.
type outboxRun struct {
	commits uint64
	drainMs float64
}

// measureOutbox drains outboxPods pod statuses through the real uplink, a real bbolt file and a
// real link to a mosquitto of its own, and counts the bbolt commits it took (store.DB.Commits: the
// file's transaction id, which each commit raises by one) from the first report to the moment the
// outbox is empty and the broker's retained summary counts every pod. No agent and no containerd
// take part: the figure is the outbox's cost per status, which the agent pays for every status
// change it reports.
func (b *bench) measureOutbox(ctx context.Context, r *results) error {
	ctx, cancel := b.stepCtx(ctx)
	defer cancel()
	br, err := b.newBroker("outbox", false)
	if err != nil {
		return err
	}
	if _, err := b.startBroker(br); err != nil {
		return err
	}
	defer b.stopBroker(br)
	dir := b.path("outbox")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	db, err := store.Open(filepath.Join(dir, store.FileName))
	if err != nil {
		return err
	}
	defer db.Close()

	// A reader on the harness listener follows the retained summary: the uplink queues it after
	// the statuses it counts, so the one that counts every pod is the last thing to drain.
	reader, err := mqttClient(br.harnessURL(), "outbox-reader")
	if err != nil {
		return err
	}
	defer reader.Disconnect(0)
	summaries, err := subscribe(reader, mqttTopics.Summary(nodeName))
	if err != nil {
		return err
	}

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := link.New(link.Options{
		Broker: br.clientURL(), ClientID: nodeName,
		Subscriptions: []string{mqttTopics.Summary(nodeName), mqttTopics.NodeMarker(nodeName)},
		NextSession:   db.NextSession, Log: quiet,
	})
	if err != nil {
		return err
	}
	up := uplink.New(uplink.Options{Node: nodeName, Topics: mqttTopics, Store: db, Link: outboxLink{l}, Log: quiet})
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Go(func() { l.Run(runCtx) })
	wg.Go(func() { up.Run(runCtx) })
	wg.Go(func() {
		// What nodesync's routing does for the uplink.
		for {
			select {
			case <-runCtx.Done():
				return
			case m := <-l.Inbox():
				if t, err := mqttTopics.Parse(m.Topic); err == nil && t.Node == nodeName {
					up.Receive(t.Class, m.Payload, m.Retained, m.Session)
				}
			}
		}
	})
	if _, _, err := l.WaitConnected(ctx); err != nil {
		return err
	}
	// The connection's own check (its marker) writes nothing; wait for the link to be quiet anyway
	// so the count starts from an idle uplink.
	time.Sleep(500 * time.Millisecond)

	before, err := db.Commits()
	if err != nil {
		return err
	}
	t0 := time.Now()
	for i := range outboxPods {
		p := b.benchPod(fmt.Sprintf("outbox-%03d", i))
		up.PodStatus(store.DesiredPod{Pod: p, Generation: 1}, v1.PodStatus{Phase: v1.PodRunning, Message: randomWord()})
	}
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the %d statuses did not drain within %s: %w", outboxPods, b.cfg.step, ctx.Err())
		case m := <-summaries:
			s, err := protocol.DecodeStatusSummary(m.payload, 0)
			if err != nil {
				return fmt.Errorf("the node's summary on the broker: %w", err)
			}
			if s.Pods != outboxPods {
				continue
			}
		}
		break
	}
	// The summary reached the broker; its PUBACK and the removal follow.
	for {
		st, err := db.OutboxStats()
		if err != nil {
			return err
		}
		if st.Entries == 0 {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the outbox still holds %d entries after the summary reached the broker: %w", st.Entries, ctx.Err())
		}
		time.Sleep(2 * time.Millisecond)
	}
	drained := time.Since(t0)
	after, err := db.Commits()
	if err != nil {
		return err
	}
	if err := b.checkOutboxStatuses(ctx, br); err != nil {
		return err
	}
	r.outbox = outboxRun{commits: after - before, drainMs: float64(drained.Microseconds()) / 1000}
	r.OutboxFsyncsPerStatus = float64(after-before) / outboxPods
	return nil
}

// checkOutboxStatuses reads the broker's retained pod statuses of the node, completely (a marker
// comes back after them), and fails unless every one of the figure's pods is there.
func (b *bench) checkOutboxStatuses(ctx context.Context, br *broker) error {
	// Its own client, with paho's handlers called in order (mqttClient's are not), so that every
	// retained status is in ch before the marker.
	id := "bench-outbox-check-" + randomWord()
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(br.harnessURL()).SetClientID(id).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).SetOrderMatters(true))
	if err := waitTok(c.Connect(), "connect the outbox check's client to "+br.harnessURL()); err != nil {
		return err
	}
	defer c.Disconnect(0)
	value := randomWord()
	marker := mqttTopics.Marker(id)
	ch, err := subscribe(c, mqttTopics.PodStatusFilter(nodeName), marker)
	if err != nil {
		return err
	}
	if err := waitTok(c.Publish(marker, 1, false, []byte(value)), "publish the marker"); err != nil {
		return err
	}
	seen := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the marker did not come back: %w", ctx.Err())
		case m := <-ch:
			if m.topic != marker {
				seen[m.topic] = true
				continue
			}
			if string(m.payload) != value {
				continue
			}
		}
		break
	}
	if len(seen) != outboxPods {
		return fmt.Errorf("the broker holds %d retained pod statuses of %s, want %d", len(seen), nodeName, outboxPods)
	}
	return nil
}

func randomWord() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// outboxLink adapts the link to the uplink, as nodesync's does.
type outboxLink struct{ *link.Link }

func (l outboxLink) Send(topic string, payload []byte, retained bool) uplink.Receipt {
	return l.Publish(topic, payload, retained)
}

// printOutbox adds the outbox figure to the table.
func printOutbox(w io.Writer, r results, ran func(string) bool) {
	if !ran("outbox") {
		return
	}
	mark := "ok"
	if r.OutboxFsyncsPerStatus > outboxTarget {
		mark = "MISSED"
	}
	// bbolt 1.5 calls fdatasync twice per commit (data pages, then the meta page).
	fmt.Fprintf(w, "outbox_fsyncs_per_status\t%.3f\t<= %.1f (%d bbolt commits, %d fdatasync calls, for %d statuses; drained in %.0f ms)\t%s\n",
		r.OutboxFsyncsPerStatus, outboxTarget, r.outbox.commits, 2*r.outbox.commits, outboxPods, r.outbox.drainMs, mark)
}
