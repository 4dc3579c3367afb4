//go:build !linux

package cdc

import "net"

// setReceiveLowWater is Linux-only (where epoll honours SO_RCVLOWAT for
// TCP); elsewhere the stream reads every segment as it arrives.
func setReceiveLowWater(net.Conn, int) bool { return false }
