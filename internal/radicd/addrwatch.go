package radicd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// addrPollEvery is how often the node's interface is read even without a
// netlink event (the events are only a shortcut).
const addrPollEvery = 200 * time.Millisecond

// addrFile, in the state directory, keeps this node's address and
// generation.
const addrFile = "address"

func loadAddrState(dir string) (addrState, bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, addrFile))
	if errors.Is(err, os.ErrNotExist) {
		return addrState{}, false, nil
	}
	if err != nil {
		return addrState{}, false, err
	}
	var st addrState
	if err := json.Unmarshal(b, &st); err != nil {
		return addrState{}, false, fmt.Errorf("%s: %w", filepath.Join(dir, addrFile), err)
	}
	return st, true, nil
}

// saveAddrState writes the file durably (temporary file, fsync, rename).
func saveAddrState(dir string, st addrState) error {
	b, _ := json.Marshal(st)
	p := filepath.Join(dir, addrFile)
	f, err := os.OpenFile(p+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(p+".tmp", p)
	}
	return err
}

// usable reports whether a is an address a node can be reached at.
func usable(a netip.Addr) bool {
	return a.Is4() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsUnspecified() && !a.IsMulticast()
}

// ifaceAddrs returns the usable IPv4 addresses of interface index, in the
// kernel's order (the primary address first).
func ifaceAddrs(index int) ([]netip.Addr, error) {
	ifi, err := net.InterfaceByIndex(index)
	if err != nil {
		return nil, err
	}
	as, err := ifi.Addrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if pn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(pn.IP); ok && usable(ip.Unmap()) {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// nodeIface finds the interface of this node: the one holding ip or, when
// none does (radicd restarted after its node moved), the only
// non-loopback interface with a usable IPv4 address.
func nodeIface(ip netip.Addr) (net.Interface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return net.Interface{}, err
	}
	var cands []net.Interface
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback != 0 {
			continue
		}
		as, err := ifaceAddrs(ifi.Index)
		if err != nil || len(as) == 0 {
			continue
		}
		if slices.Contains(as, ip) {
			return ifi, nil
		}
		cands = append(cands, ifi)
	}
	if len(cands) == 1 {
		return cands[0], nil
	}
	return net.Interface{}, fmt.Errorf("no interface holds %v, and %d others have IPv4 addresses", ip, len(cands))
}

// initAddress sets this node's entry in the location table at start: the
// generation kept in the state directory, and a new one if the node's
// address is not the one recorded (it changed while radicd was down). It
// returns the interface to watch (ok false: none, radicd does not follow
// its address).
func (d *Daemon) initAddress() (ifi net.Interface, ok bool) {
	logical := d.cfg.Listen.Addr().Unmap()
	cur := logical
	if d.cfg.watchesAddress() {
		var err error
		ifi, err = nodeIface(logical)
		if err != nil {
			d.log.Warn("not following this node's address (a readdress would make this node unreachable)", "err", err)
		} else {
			ok = true
			d.beaconIf.Store(int32(ifi.Index))
			if as, err := ifaceAddrs(ifi.Index); err == nil && len(as) > 0 && !slices.Contains(as, logical) {
				cur = as[0]
			}
		}
	}
	st, have, err := loadAddrState(d.cfg.StateDir)
	if err != nil {
		d.log.Warn("ignoring the recorded address generation", "err", err)
		have = false
	}
	rec, _ := netip.ParseAddr(st.Addr)
	switch {
	case have && rec.Unmap() == cur:
		if st.Gen > 0 {
			if _, err := d.loc.table.Move(int(d.self), cur, st.Gen); err != nil {
				d.log.Error("cannot restore this node's address generation", "err", err)
			}
			d.log.Info("this node's address generation restored", "addr", cur, "gen", st.Gen, "logical", logical)
			d.loc.announce(moveOf(int(d.self), cur, st.Gen))
		}
	case have || cur != logical:
		d.loc.moveSelf(cur, st.Gen+1, "the address differs from the one recorded when radicd last ran")
	}
	if ok {
		d.log.Info("following this node's address", "interface", ifi.Name, "addr", cur, "logical", logical)
	}
	return ifi, ok
}

// routineAddrWatch follows the node's address on ifi: on a change it moves
// this node in the location table with the next generation and announces
// it. Netlink address events wake it at once; it also polls.
func (d *Daemon) routineAddrWatch(ctx context.Context, ifi net.Interface) {
	log := d.log.With("routine", "RoutineAddrWatch", "interface", ifi.Name)
	log.Info("RoutineAddrWatch starting")
	defer log.Info("RoutineAddrWatch stopped")
	events := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	if f, err := subscribeAddrEvents(); err != nil {
		log.Warn("no netlink address events: polling only", "every", addrPollEvery, "err", err)
	} else {
		defer f.Close() // ends the reader (before wg.Wait)
		wg.Go(func() {
			buf := make([]byte, 16<<10)
			for {
				if _, err := f.Read(buf); err != nil {
					if errors.Is(err, os.ErrClosed) || ctx.Err() != nil {
						return
					}
					// ENOBUFS (events lost) and the like: the poll
					// below catches up; wake it anyway.
					time.Sleep(10 * time.Millisecond)
				}
				select {
				case events <- struct{}{}:
				default:
				}
			}
		})
	}
	t := time.NewTicker(addrPollEvery)
	defer t.Stop()
	index := ifi.Index
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-events:
		}
		as, err := ifaceAddrs(index)
		if err != nil {
			// The interface went away; a new one may carry its name.
			if n, err := net.InterfaceByName(ifi.Name); err == nil {
				index = n.Index
				d.beaconIf.Store(int32(index))
			}
			continue
		}
		if len(as) == 0 {
			continue // between the old address's removal and the new one's
		}
		me, _ := d.loc.table.Node(int(d.self))
		if slices.Contains(as, me.Addr) {
			continue
		}
		d.loc.moveSelf(as[0], 0, "the address of "+ifi.Name+" changed")
	}
}

// subscribeAddrEvents opens a netlink socket that receives the kernel's
// IPv4 address and link events, as a pollable file.
func subscribeAddrEvents() (*os.File, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_LINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return os.NewFile(uintptr(fd), "netlink-route"), nil
}
