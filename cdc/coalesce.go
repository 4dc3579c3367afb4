package cdc

import (
	"net"
	"time"
)

// coalescer lets WAL data gather in the socket while it streams in (see
// StreamConfig.CoalesceWindow): it starts with the first data after a
// quiet spell and ends after a window in which nothing arrived, so an idle
// stream sleeps until the next message.
type coalescer struct {
	nc        net.Conn
	window    time.Duration
	can, on   bool
	windowEnd time.Time // while on: when the current window ends
	msgs      int       // messages received in the current window
}

func newCoalescer(nc net.Conn, window time.Duration) coalescer {
	return coalescer{nc: nc, window: window, can: window > 0 && setReceiveLowWater(nc, 1)}
}

// set turns coalescing on or off; a socket that refuses the option turns
// it off for good.
func (c *coalescer) set(on bool) {
	lowat := 1
	if on {
		lowat = coalesceLowWater
	}
	if !setReceiveLowWater(c.nc, lowat) {
		c.can, on = false, false
	}
	c.on = on
}

// arrived counts a message, starting a window after a quiet spell.
func (c *coalescer) arrived() {
	switch {
	case c.on:
		c.msgs++
	case c.can:
		c.set(true)
		c.msgs, c.windowEnd = 0, time.Now().Add(c.window)
	}
}

// windowPassed ends coalescing after a window without messages. Every read
// tries the socket before it waits, so a window without messages was a
// quiet one.
func (c *coalescer) windowPassed() {
	if !c.on {
		return
	}
	if now := time.Now(); !now.Before(c.windowEnd) {
		if c.msgs == 0 {
			c.set(false)
		}
		c.msgs = 0
		c.windowEnd = now.Add(c.window)
	}
}

// off stops coalescing, so that Close reads the end of the stream at once.
func (c *coalescer) off() {
	if c.on {
		c.set(false)
	}
}
