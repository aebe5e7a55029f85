package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/link"
	"github.com/mqlet/mqlet/sync/nodesync"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// acks_bytes_after_5000_jobs: the node's retained acks must stay O(desired set), not grow with the
// history of what was ever applied. The node here is the real node channel (sync/nodesync: link,
// downlink, uplink with its outbox, over a bbolt state file of its own, kept on tmpfs in the bench's
// run dir) run inside the harness against a mosquitto of its own, with the agent replaced by a sink
// that takes every pod the downlink delivers (no containers: the figure is about the channel's
// state, and 5,000 real containers would measure containerd). The control plane is ctlclient:
// 5,000 pods, one after the other, each applied, then (once the node's acks list it applied)
// deleted, then the next; the next job's acks (a later index, without the deleted one) show the
// deletion taken in, and after 1, 10, 100, 1,000 and 5,000 jobs the harness waits for the
// deletion's own acks and notes their size. The figure is the size of the node's retained acks
// payload at the end; the table also shows the largest acks payload seen during the run and the
// node's sync marks. The run fails unless the sink was handed exactly 5,000 pods and 5,000
// deletions.
const (
	jobsCount      = 5000
	jobsNode       = "bench-jobs"
	jobsAcksTarget = 64 << 10 // bytes
)

type jobsResult struct {
	jobs             int
	largest          int           // the largest acks payload seen
	at               map[int]int   // acks bytes after N jobs
	indexBytes       int           // the retained index at the end
	marks            int           // the node's sync marks at the end (index included)
	dbBytes          int64         // size of its bbolt file
	wall             time.Duration // the whole loop
	applied, deleted int64         // pods the sink was given, and told to delete
	// Where a job's time goes, summed: ctlclient's apply, until the node's acks list it applied
	// (and so the previous job deleted), ctlclient's delete, and at the checkpoints until the
	// node's acks show the index without it.
	apply, applyAck, del, delAck time.Duration
}

func (b *bench) measureAcksJobs(ctx context.Context, r *results) error {
	if b.cfg.mosquitto == "" {
		return errors.New("-mosquitto is required (scripts/bench.sh passes it)")
	}
	br, err := b.newBroker("jobs", false)
	if err != nil {
		return err
	}
	if err := appendConf(br, jobsBrokerConf); err != nil {
		return err
	}
	if _, err := b.startBroker(br); err != nil {
		return err
	}
	defer b.stopBroker(br)

	dir := b.path("jobs-node")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// The state file on tmpfs (the bench's run dir): the figure is a size, and 10,000 index
	// changes at the several fsyncs each that the node pays on this VM's disk would take ~10 min.
	dbDir := b.runPath("jobs-node")
	if err := os.MkdirAll(dbDir, 0o700); err != nil {
		return err
	}
	dbPath := filepath.Join(dbDir, store.FileName)
	key := make([]byte, 32)
	rand.Read(key)
	db, err := store.OpenWith(dbPath, store.Options{SecretKey: key})
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(dir, "node.log"))
	if err != nil {
		db.Close()
		return err
	}
	defer logf.Close()
	s, err := nodesync.New(nodesync.Options{
		Node: jobsNode, Topics: mqttTopics, Store: db,
		Link: link.Options{Broker: br.clientURL(), ReconnectMin: 100 * time.Millisecond, ReconnectMax: time.Second},
		Log:  slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		db.Close()
		return err
	}
	var applied, deleted atomic.Int64
	nctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errc <- s.Run(nctx) }()
	go func() {
		defer wg.Done()
		errc <- s.Source().Run(nctx, func(c source.Change) source.Result {
			switch c.Op {
			case source.Upsert:
				applied.Add(int64(len(c.Items)))
			case source.Delete:
				deleted.Add(int64(len(c.Keys)))
			}
			return source.Result{}
		})
	}()
	defer func() {
		stop()
		wg.Wait()
		db.Close()
	}()
	alive := func() error {
		select {
		case err := <-errc:
			return fmt.Errorf("the node channel stopped: %v (log %s)", err, filepath.Join(dir, "node.log"))
		default:
			return nil
		}
	}

	cl, err := b.ctlConnect(ctx, br, "jobs-cp")
	if err != nil {
		return err
	}
	defer cl.Close()
	f, err := followAcks(br, "jobs-acks", jobsNode)
	if err != nil {
		return err
	}
	defer f.close()
	if _, _, err := f.wait(ctx, b, "published", func(*protocol.Acks) bool { return true }); err != nil {
		return errors.Join(err, alive())
	}
	x := &r.jobs
	x.at = map[int]int{}
	t0 := time.Now()
	for i := 0; i < jobsCount; i++ {
		name := fmt.Sprintf("job-%04d", i)
		k := protocol.ObjectKey(protocol.KindPod, podNamespace, name)
		t := time.Now()
		res, err := cl.Apply(ctx, jobsNode, []any{b.jobPod(name)})
		x.apply += time.Since(t)
		t = time.Now()
		if err != nil {
			return fmt.Errorf("job %d: %w", i, errors.Join(err, alive()))
		}
		gen := res.Objects[0].Generation
		if _, _, err := f.wait(ctx, b, fmt.Sprintf("%s applied at generation %d", k, gen), func(a *protocol.Acks) bool {
			// This bench is the node's only writer: the acks of the revision it wrote are of its
			// index, which lists k at gen.
			if a.IndexRevision != res.Generation || a.Missing[k].Generation != 0 || a.Refused[k].Generation != 0 {
				return false
			}
			return a.Compact || a.Applied[k].Generation == gen
		}); err != nil {
			return fmt.Errorf("job %d: %w", i, errors.Join(err, alive()))
		}
		x.applyAck += time.Since(t)
		t = time.Now()
		rev, err := cl.Delete(ctx, jobsNode, protocol.KindPod, podNamespace, name)
		x.del += time.Since(t)
		t = time.Now()
		if err != nil {
			return fmt.Errorf("job %d: %w", i, errors.Join(err, alive()))
		}
		// The next job's acks (an index of a later revision, without this one) show this deletion
		// taken in too, so only the checkpoints wait for it on its own.
		n := i + 1
		if n != 1 && n != 10 && n != 100 && n != 1000 && n != jobsCount {
			continue
		}
		_, p, err := f.wait(ctx, b, fmt.Sprintf("index revision %d without %s", rev, k), func(a *protocol.Acks) bool {
			_, ap := a.Applied[k]
			_, mi := a.Missing[k]
			_, re := a.Refused[k]
			return a.IndexRevision == rev && !ap && !mi && !re
		})
		if err != nil {
			return fmt.Errorf("job %d: %w", i, errors.Join(err, alive()))
		}
		x.delAck += time.Since(t)
		x.at[n] = len(p)
		b.logf("acks after %d jobs: %d bytes (%.1f s)", n, len(p), time.Since(t0).Seconds())
	}
	x.wall = time.Since(t0)
	x.jobs = jobsCount
	got, err := cl.Snapshot(ctx, mqttTopics.Acks(jobsNode), mqttTopics.Index(jobsNode))
	if err != nil {
		return err
	}
	acks := got[mqttTopics.Acks(jobsNode)]
	if len(acks) == 0 {
		return errors.New("the broker holds no acks of the jobs node at the end")
	}
	f.mu.Lock()
	x.largest = f.largest
	f.mu.Unlock()
	x.indexBytes = len(got[mqttTopics.Index(jobsNode)])
	marks, _, err := db.ListMarks()
	if err != nil {
		return err
	}
	x.marks = len(marks)
	if st, err := os.Stat(dbPath); err == nil {
		x.dbBytes = st.Size()
	}
	x.applied, x.deleted = applied.Load(), deleted.Load()
	if x.applied != jobsCount || x.deleted != jobsCount {
		return fmt.Errorf("the node handed its agent %d pods and %d deletions for %d jobs", x.applied, x.deleted, jobsCount)
	}
	r.AcksBytesAfter5000Jobs = float64(len(acks))
	return alive()
}

// jobsBrokerConf is added to the jobs broker's config. mosquitto leaves Nagle's algorithm on by
// default: when it writes two small packets in a row to a client (a SUBACK, then the retained
// message the subscription brings; an index, then the next), the second waits for the client's
// delayed ACK of the first, ~40 ms on Linux. The node's path meets that wait two or three times per
// index (measured: 20 jobs in 2.9 s with the default, in 0.5 s with this line), which
// would make 5,000 jobs take ~11 minutes here. The figure is a size, which Nagle does not change.
const jobsBrokerConf = "\n# Nagle off (see jobsBrokerConf in tools/bench/acksjobs.go).\nset_tcp_nodelay true\n"

func appendConf(br *broker, extra string) error {
	f, err := os.OpenFile(br.conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(extra)
	return err
}

// jobPod is a short-lived pod as a batch system would bind it: one busybox container that exits.
func (b *bench) jobPod(name string) *v1.Pod {
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace, Labels: map[string]string{"job": name}},
		Spec: v1.PodSpec{
			RestartPolicy: v1.RestartPolicyNever,
			Containers: []v1.Container{{Name: "job", Image: b.cfg.image, ImagePullPolicy: v1.PullNever,
				Command: []string{"sh", "-c", "echo done"}}},
		},
	}
}

// printV2 adds the protocol v2 figures to the table (printResults).
func printV2(tw io.Writer, r results, ran func(string) bool) {
	row := func(name string, v float64, unit, target string, ok bool) {
		mark := "ok"
		if !ok {
			mark = "MISSED"
		}
		fmt.Fprintf(tw, "%s\t%.0f %s\t%s\t%s\n", name, v, unit, target, mark)
	}
	if ran("reconnect50") {
		x := r.reconnect50
		ratio := r.reconnect50Ratio()
		row("reconnect_bytes_50_mqtt_pods_1_changed", r.ReconnectBytes50Pods1Changed, "B",
			fmt.Sprintf("<= %.1f x floor (%.0f): %.2f x", r50Ratio, r50Ratio*r.ReconnectFloorBytes1Changed, ratio), ratio > 0 && ratio <= r50Ratio)
		fmt.Fprintf(tw, "  agent link, broker start -> quiet\tup %d B in %d packets, down %d B in %d packets\tto the change taken in (%.1f ms; online at %.1f ms): %d B\t\n",
			x.all.Up, x.all.UpPkts, x.all.Down, x.all.DnPkts, x.converge, x.online, x.conv.total())
		fmt.Fprintf(tw, "  PUBLISH from the agent\t%s\t%d payload bytes\t\n", classes(x.pubs.received), x.pubs.receivedBytes)
		fmt.Fprintf(tw, "  PUBLISH to the agent\t%s\t%d payload bytes\t\n", classes(x.pubs.sent), x.pubs.sentBytes)
		fmt.Fprintf(tw, "reconnect_floor_bytes_1_changed\t%.0f B\tbare paho client: index %d + object %d + status %d payload bytes (%d), up %d B, down %d B\t\n",
			r.ReconnectFloorBytes1Changed, x.indexBytes, x.objectBytes, x.statusBytes, x.indexBytes+x.objectBytes+x.statusBytes, x.floor.Up, x.floor.Down)
		fmt.Fprintf(tw, "  the node's acks at the end\t%d B\t(50 entries)\t\n", x.acksBytes)
	}
	if ran("acks5000") {
		j := r.jobs
		var at []string
		for _, n := range slices.Sorted(maps.Keys(j.at)) {
			at = append(at, fmt.Sprintf("%d: %d B", n, j.at[n]))
		}
		row("acks_bytes_after_5000_jobs", r.AcksBytesAfter5000Jobs, "B", fmt.Sprintf("<= %d (largest seen %d B; after %s)", jobsAcksTarget, j.largest, strings.Join(at, ", ")),
			r.AcksBytesAfter5000Jobs > 0 && r.AcksBytesAfter5000Jobs <= jobsAcksTarget)
		per := func(d time.Duration) float64 { return ms(d) / float64(max(j.jobs, 1)) }
		fmt.Fprintf(tw, "  %d jobs in %.1f s\tper job: apply %.1f ms, node acks it %.1f ms, delete %.1f ms (at the 5 checkpoints the node acked the deletion in %.1f ms in all)\tsink given %d pods, %d deletions; index %d B; node's sync marks %d, bbolt file %d B\t\n",
			j.jobs, j.wall.Seconds(), per(j.apply), per(j.applyAck), per(j.del), ms(j.delAck), j.applied, j.deleted, j.indexBytes, j.marks, j.dbBytes)
	}
}
