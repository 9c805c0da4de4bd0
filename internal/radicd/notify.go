package radicd

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"
)

// notifier speaks the sd_notify protocol: datagrams of newline-separated
// VAR=value to the unix datagram socket named by $NOTIFY_SOCKET (a path, or
// an abstract name when it starts with '@'). Without $NOTIFY_SOCKET it does
// nothing.
type notifier struct {
	addr string
}

func newNotifier() *notifier { return &notifier{addr: os.Getenv("NOTIFY_SOCKET")} }

// Notify sends one state string such as "READY=1\nSTATUS=serving".
func (n *notifier) Notify(state string) error {
	if n == nil || n.addr == "" {
		return nil
	}
	addr := n.addr
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify %s: %w", n.addr, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify %s: %w", n.addr, err)
	}
	return nil
}

// watchdogInterval returns half of $WATCHDOG_USEC when it is meant for this
// process ($WATCHDOG_PID absent or ours), else 0.
func watchdogInterval() time.Duration {
	us, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || us <= 0 {
		return 0
	}
	if p := os.Getenv("WATCHDOG_PID"); p != "" && p != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(us) * time.Microsecond / 2
}
