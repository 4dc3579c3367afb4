package cdc

import (
	"crypto/tls"
	"net"
	"syscall"
)

// setReceiveLowWater sets SO_RCVLOWAT on the TCP socket under nc: the
// kernel then wakes a reader only once n bytes are queued (or its read
// deadline passes), instead of once per arriving segment. It reports
// whether the option took; connections that are not TCP (a Unix socket)
// are left alone, since their poll ignores the option.
func setReceiveLowWater(nc net.Conn, n int) bool {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	tcp, ok := nc.(*net.TCPConn)
	if !ok {
		return false
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	}); err != nil {
		return false
	}
	return serr == nil
}
