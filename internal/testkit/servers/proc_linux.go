package servers

import "syscall"

// sysProcAttr starts a server in a process group of its own, as cred, and
// has the kernel send it deathSig when the Go process dies.
func sysProcAttr(cred *syscall.Credential, deathSig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: deathSig}
}
