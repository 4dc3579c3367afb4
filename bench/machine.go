package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/walcount/walcount/internal/testkit/servers"
)

// machine describes where the numbers come from.
type machine struct {
	cpus     int
	cpuModel string
	memGiB   float64
	kernel   string
	postgres string
	redis    string
	goVer    string
	storage  string
}

func (m machine) summary() string {
	return fmt.Sprintf("%d CPUs (%s), %.0f GiB RAM, Linux %s; %s; %s; %s; data on %s",
		m.cpus, m.cpuModel, m.memGiB, m.kernel, m.postgres, m.redis, m.goVer, m.storage)
}

func describeMachine(dataDir string) machine {
	m := machine{cpus: runtime.NumCPU(), goVer: runtime.Version()}
	m.cpuModel = "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpuModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var kb float64
			if _, err := fmt.Sscanf(sc.Text(), "MemTotal: %f kB", &kb); err == nil {
				m.memGiB = kb / (1 << 20)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	m.postgres = "PostgreSQL ?"
	if dir, err := servers.FindPostgresBin(); err == nil {
		if out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").Output(); err == nil {
			m.postgres = strings.TrimPrefix(strings.TrimSpace(string(out)), "postgres (PostgreSQL) ")
			m.postgres = "PostgreSQL " + m.postgres
		}
	}
	m.redis = "Redis ?"
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if v, ok := strings.CutPrefix(f, "v="); ok {
				m.redis = "Redis " + v
			}
		}
	}
	m.storage = dataDir + " (" + fsType(dataDir) + ")"
	return m
}

// fsType names the file system of dir.
func fsType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "unknown fs"
	}
	switch st.Type {
	case 0x01021994:
		return "tmpfs: fsync is free"
	case 0xEF53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x794c7630:
		return "overlayfs"
	}
	return fmt.Sprintf("fs 0x%x", st.Type)
}

// cpuTimes is the first line of /proc/stat, in clock ticks.
type cpuTimes struct {
	total, steal uint64
}

func readCPUTimes() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var t cpuTimes
	for i, v := range f[1:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			continue
		}
		if i < 8 { // user nice system idle iowait irq softirq steal; guest is inside user
			t.total += n
		}
		if i == 7 {
			t.steal = n
		}
	}
	return t
}

// loadAverage returns the 1-minute load average.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// busyMeter describes what else ran on the machine during the run.
type busyMeter struct {
	load0 string
	cpu0  cpuTimes
}

func startBusyMeter() busyMeter { return busyMeter{load0: loadAverage(), cpu0: readCPUTimes()} }

func (m busyMeter) String() string {
	cpu1 := readCPUTimes()
	steal := 0.0
	if d := cpu1.total - m.cpu0.total; d > 0 {
		steal = float64(cpu1.steal-m.cpu0.steal) / float64(d) * 100
	}
	return fmt.Sprintf("1-minute load average %s before the run and %s at its end (%d CPUs), CPU steal %.0f%%",
		m.load0, loadAverage(), runtime.NumCPU(), steal)
}
