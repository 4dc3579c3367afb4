//go:build !linux

package servers

import "syscall"

// sysProcAttr starts a server in a process group of its own, as cred.
// Only Linux can have the kernel signal it when the Go process dies
// (Pdeathsig): elsewhere a server whose walcount demo or test was killed
// (rather than stopped, which stops its servers) keeps running until it is
// stopped by hand.
func sysProcAttr(cred *syscall.Credential, _ syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
