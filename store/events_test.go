package store

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// testEvents is a pod's list of n distinct events, a second apart, each seen twice.
func testEvents(uid types.UID, name string, n int) PodEvents {
	at := time.Date(2026, 3, 14, 9, 26, 53, 123_456_789, time.UTC)
	p := PodEvents{UID: uid, Namespace: "default", Name: name}
	for i := range n {
		p.Events = append(p.Events, EventRecord{
			Type: "Warning", Reason: "BackOff", Message: fmt.Sprintf("message %d", i),
			FieldPath: "spec.containers{main}", Count: 2,
			FirstTime: at.Add(time.Duration(i) * time.Second), LastTime: at.Add(time.Duration(i)*time.Second + time.Millisecond),
		})
	}
	return p
}

func listEventUIDs(t *testing.T, s State) []string {
	t.Helper()
	got, bad, err := s.ListEvents()
	if err != nil || len(bad) != 0 {
		t.Fatalf("ListEvents: %v, record errors %v", err, bad)
	}
	var uids []string
	for _, p := range got {
		uids = append(uids, string(p.UID))
	}
	return uids
}

// testEventsRoundTrip: lists come back exactly (nanoseconds kept, order kept), a put replaces the
// pod's list, one UpdateEvents puts and deletes together, a missing record is not an error, and
// nothing is shared with the caller.
func testEventsRoundTrip(t *testing.T, s stateUnderTest) {
	if p, ok, err := s.GetEvents("uid-a"); ok || err != nil || p.UID != "" {
		t.Fatalf("GetEvents on an empty state = %+v, %v, %v", p, ok, err)
	}
	a, b := testEvents("uid-a", "a", 3), testEvents("uid-b", "b", 1)
	b.Events[0].Source = "file /etc/mqlet/pods/b.yaml#0"
	b.Events[0].FieldPath = ""
	if err := s.UpdateEvents([]PodEvents{a, b}, nil); err != nil {
		t.Fatal(err)
	}
	want := testEvents("uid-a", "a", 3)
	a.Events[0].Message = "changed by the caller after the put"
	got, ok, err := s.GetEvents("uid-a")
	if err != nil || !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("GetEvents(uid-a) = %+v, %v, %v; want %+v", got, ok, err, want)
	}
	got.Events[1].Count = 99
	if again, _, _ := s.GetEvents("uid-a"); again.Events[1].Count != 2 {
		t.Errorf("a change to a returned list reached the store")
	}
	gb, _, _ := s.GetEvents("uid-b")
	if gb.Events[0].Source != "file /etc/mqlet/pods/b.yaml#0" || gb.Events[0].FieldPath != "" {
		t.Errorf("uid-b came back %+v", gb.Events[0])
	}
	if uids := listEventUIDs(t, s); !reflect.DeepEqual(uids, []string{"uid-a", "uid-b"}) {
		t.Errorf("ListEvents = %v, want [uid-a uid-b] (by namespace and name)", uids)
	}

	// A put replaces; put and delete in one call; deleting what is not there is fine.
	c := testEvents("uid-c", "c", 1)
	if err := s.UpdateEvents([]PodEvents{testEvents("uid-a", "a", 1), c}, []types.UID{"uid-b", "uid-none"}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.GetEvents("uid-a"); len(got.Events) != 1 {
		t.Errorf("uid-a after a replacing put holds %d events, want 1", len(got.Events))
	}
	if uids := listEventUIDs(t, s); !reflect.DeepEqual(uids, []string{"uid-a", "uid-c"}) {
		t.Errorf("ListEvents after update = %v, want [uid-a uid-c]", uids)
	}
	if err := s.DeleteEvents("uid-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteEvents("uid-a"); err != nil {
		t.Errorf("deleting a missing record: %v", err)
	}
	if uids := listEventUIDs(t, s); !reflect.DeepEqual(uids, []string{"uid-c"}) {
		t.Errorf("ListEvents after delete = %v, want [uid-c]", uids)
	}
	if err := s.UpdateEvents(nil, nil); err != nil {
		t.Errorf("empty update: %v", err)
	}
}

// testEventsRefused: bad input is refused with a message naming what was wrong, and changes
// nothing (not even the valid part of the same call).
func testEventsRefused(t *testing.T, s stateUnderTest) {
	if err := s.UpdateEvents([]PodEvents{testEvents("uid-keep", "keep", 1)}, nil); err != nil {
		t.Fatal(err)
	}
	mod := func(f func(p *PodEvents)) PodEvents {
		p := testEvents("uid-x", "x", 2)
		f(&p)
		return p
	}
	for name, c := range map[string]struct {
		put  []PodEvents
		del  []types.UID
		want string
	}{
		"no uid":        {put: []PodEvents{mod(func(p *PodEvents) { p.UID = "" })}, want: "empty pod uid"},
		"no name":       {put: []PodEvents{mod(func(p *PodEvents) { p.Name = "" })}, want: "uid-x"},
		"no events":     {put: []PodEvents{mod(func(p *PodEvents) { p.Events = nil })}, want: "no events"},
		"too many":      {put: []PodEvents{testEvents("uid-x", "x", MaxEventsPerRecord+1)}, want: "the most one record holds"},
		"no reason":     {put: []PodEvents{mod(func(p *PodEvents) { p.Events[1].Reason = "" })}, want: "events[1]"},
		"count 0":       {put: []PodEvents{mod(func(p *PodEvents) { p.Events[0].Count = 0 })}, want: "count 0"},
		"zero time":     {put: []PodEvents{mod(func(p *PodEvents) { p.Events[0].LastTime = time.Time{} })}, want: "zero"},
		"last < first":  {put: []PodEvents{mod(func(p *PodEvents) { p.Events[0].LastTime = p.Events[0].FirstTime.Add(-time.Second) })}, want: "before firstTime"},
		"uid twice":     {put: []PodEvents{testEvents("uid-x", "x", 1), testEvents("uid-x", "x", 1)}, want: "appears twice"},
		"put and del":   {put: []PodEvents{testEvents("uid-x", "x", 1)}, del: []types.UID{"uid-x"}, want: "also in put"},
		"empty del uid": {put: []PodEvents{testEvents("uid-x", "x", 1)}, del: []types.UID{""}, want: "del[0]"},
	} {
		err := s.UpdateEvents(append([]PodEvents{testEvents("uid-new", "new", 1)}, c.put...), append(c.del, "uid-keep"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to mention %q", name, err, c.want)
		}
	}
	if uids := listEventUIDs(t, s); !reflect.DeepEqual(uids, []string{"uid-keep"}) {
		t.Errorf("after refused updates: %v, want only [uid-keep]", uids)
	}
	if err := s.DeleteEvents(""); err == nil {
		t.Errorf("DeleteEvents(\"\"): no error")
	}
}

// testEventsBadRecords: an undecodable record is reported naming bucket and key and skipped by
// List; the others load; Get reports it as an error.
func testEventsBadRecords(t *testing.T, s stateUnderTest) {
	if err := s.UpdateEvents([]PodEvents{testEvents("uid-good", "good", 2)}, nil); err != nil {
		t.Fatal(err)
	}
	s.setRaw(t, "events", "uid-junk", []byte("{not json"))
	s.setRaw(t, "events", "uid-empty", []byte(`{"namespace":"default","name":"e","events":[]}`))
	got, bad, err := s.ListEvents()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].UID != "uid-good" || len(got[0].Events) != 2 {
		t.Errorf("good records = %+v", got)
	}
	if len(bad) != 2 || bad[0].Key != "uid-empty" || bad[1].Key != "uid-junk" || bad[0].Bucket != "events" {
		t.Errorf("record errors = %v, want events/uid-empty and events/uid-junk", bad)
	}
	if _, _, err := s.GetEvents("uid-junk"); err == nil || !strings.Contains(err.Error(), "events/uid-junk") {
		t.Errorf("GetEvents of a bad record: %v", err)
	}
}

// TestUpdateEventsOneCommit: flushing many pods' events is one transaction, one fsync; with a
// commit per pod this fails.
func TestUpdateEventsOneCommit(t *testing.T) {
	d, _ := openTemp(t)
	var put []PodEvents
	for i := range 20 {
		put = append(put, testEvents(types.UID(fmt.Sprintf("uid-%02d", i)), fmt.Sprintf("p%02d", i), 5))
	}
	before := lastTxid(t, d)
	if err := d.UpdateEvents(put, []types.UID{"uid-gone"}); err != nil {
		t.Fatal(err)
	}
	if n := lastTxid(t, d) - before; n != 1 {
		t.Errorf("UpdateEvents of 20 pods made %d commits, want 1", n)
	}
}

// TestEventsPersist: the events survive closing and reopening the file.
func TestEventsPersist(t *testing.T) {
	d, path := openTemp(t)
	if err := d.UpdateEvents([]PodEvents{testEvents("uid-a", "a", 3)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got, ok, err := d.GetEvents("uid-a"); err != nil || !ok || !reflect.DeepEqual(got, testEvents("uid-a", "a", 3)) {
		t.Errorf("after reopen: %+v, %v, %v", got, ok, err)
	}
}
