package daemon

import (
	"context"
	"sort"
	"time"
)

// EventsStatus is the change events in /status (docs/fresh-reads.md,
// "Change events"): each counter's stream and its length, the bound, and
// what was published since this process started.
type EventsStatus struct {
	// MaxLen is events_maxlen, the streams' approximate bound.
	MaxLen  int64          `json:"maxlen"`
	Streams []EventsStream `json:"streams"`
	// Published counts the entries published since this process started
	// (walcount_events_published_total), Recovered those published again
	// by a session start, Gaps the gap entries.
	Published int64 `json:"published"`
	Recovered int64 `json:"recovered"`
	Gaps      int64 `json:"gaps"`
	// Off is why change events are off for now (the Redis user may not
	// run their commands), empty while they are on.
	Off string `json:"off,omitempty"`
	// Error is why the streams' lengths could not be read.
	Error string `json:"error,omitempty"`
}

// EventsStream is one counter's stream.
type EventsStream struct {
	Counter string `json:"counter"`
	Stream  string `json:"stream"`
	// Length is XLEN, -1 when it could not be read.
	Length int64 `json:"length"`
}

// eventsStatus reads the streams' lengths from Redis; nil when change
// events are off or no counter has them.
func (d *Daemon) eventsStatus(ctx context.Context) *EventsStatus {
	streams := d.events.Streams()
	if len(streams) == 0 {
		return nil
	}
	s := &EventsStatus{MaxLen: d.events.MaxLen(), Off: d.events.Off(), Recovered: countOf(d.m.EventsRecovered), Gaps: countOf(d.m.EventsGaps)}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	lens, err := d.events.Lengths(ctx)
	if err != nil {
		s.Error = err.Error()
	}
	for name, stream := range streams {
		n, ok := lens[name]
		if !ok {
			n = -1
		}
		s.Streams = append(s.Streams, EventsStream{Counter: name, Stream: stream, Length: n})
		s.Published += countOf(d.m.EventsPublished.WithLabelValues(name))
	}
	sort.Slice(s.Streams, func(i, j int) bool { return s.Streams[i].Counter < s.Streams[j].Counter })
	return s
}
