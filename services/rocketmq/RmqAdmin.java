// Small admin helper for rmq.sh: several topic/group operations in ONE JVM and without the
// slow client shutdown of MQAdminStartup (which costs ~3 s per call on this machine).
// Compiled by rmq.sh into <cache>/classes against the RocketMQ jars.
//
// usage: RmqAdmin NAMESRV CLUSTER OP...
//   wait:SECONDS[@ADDR] wait until a master broker of CLUSTER is registered in the name server;
//                       with @ADDR, nudge the broker at ADDR to register (see waitMaster)
//   topic:NAME          normal topic (message.type=NORMAL), QUEUES read/write queues
//   fifo-topic:NAME     FIFO topic (attribute +message.type=FIFO)
//   group:NAME          consumer group (concurrent)
//   fifo-group:NAME     consumer group with consumeMessageOrderly=true (needed for FIFO delivery
//                       to gRPC SimpleConsumer/PushConsumer: the proxy sets Subscription.fifo from it)
//   queues:N            queue count for the following topics (default 4)
// Exit status 0 on success, 1 on any failure (message on stderr).
import java.util.HashMap;
import java.util.Map;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.route.TopicRouteData;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

public class RmqAdmin {
    static final String KICK_TOPIC = "rmqtrace-boot";

    public static void main(String[] args) {
        int rc = 0;
        try {
            rc = run(args);
        } catch (Throwable t) {
            System.err.println("RmqAdmin: " + t);
            rc = 1;
        }
        System.out.flush();
        System.err.flush();
        Runtime.getRuntime().halt(rc);
    }

    static String masterAddr(DefaultMQAdminExt admin, String cluster) throws Exception {
        ClusterInfo info = admin.examineBrokerClusterInfo();
        if (info == null || info.getClusterAddrTable() == null) return null;
        java.util.Set<String> names = info.getClusterAddrTable().get(cluster);
        if (names == null) return null;
        for (String name : names) {
            BrokerData bd = info.getBrokerAddrTable().get(name);
            if (bd != null && bd.getBrokerAddrs().get(0L) != null) return bd.getBrokerAddrs().get(0L);
        }
        return null;
    }

    // kickAddr: broker address to nudge when it does not register by itself. The broker registers
    // at boot only if its name server availability scan already ran (a race in 5.x); otherwise the
    // next registration is 10 s later. Creating/updating a topic makes the broker register at once.
    static String waitMaster(DefaultMQAdminExt admin, String cluster, double seconds, String kickAddr)
        throws Exception {
        long start = System.nanoTime();
        long deadline = start + (long) (seconds * 1e9);
        long nextKick = start + 1_500_000_000L;
        Exception last = null;
        while (true) {
            try {
                String addr = masterAddr(admin, cluster);
                if (addr != null) return addr;
            } catch (Exception e) {
                last = e;
            }
            if (kickAddr != null && System.nanoTime() > nextKick) {
                nextKick = System.nanoTime() + 3_000_000_000L;
                try {
                    TopicConfig tc = new TopicConfig(KICK_TOPIC, 1, 1, 6);
                    Map<String, String> attrs = new HashMap<>();
                    attrs.put("+message.type", "NORMAL");
                    tc.setAttributes(attrs);
                    admin.createAndUpdateTopicConfig(kickAddr, tc);
                } catch (Exception e) {
                    last = e;
                }
            }
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("no master broker of cluster " + cluster
                    + " registered after " + seconds + " s" + (last == null ? "" : " (" + last + ")"));
            }
            Thread.sleep(250);
        }
    }

    static void waitRoute(DefaultMQAdminExt admin, String topic) throws Exception {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (true) {
            try {
                TopicRouteData route = admin.examineTopicRouteInfo(topic);
                if (route != null && !route.getQueueDatas().isEmpty()) return;
            } catch (Exception e) {
                if (System.nanoTime() > deadline) throw e;
            }
            if (System.nanoTime() > deadline) throw new IllegalStateException("no route for " + topic);
            Thread.sleep(100);
        }
    }

    static int run(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: RmqAdmin NAMESRV CLUSTER OP...");
            return 2;
        }
        String cluster = args[1];
        DefaultMQAdminExt admin = new DefaultMQAdminExt(5000L);
        admin.setNamesrvAddr(args[0]);
        admin.setInstanceName("rmqadmin-" + ProcessHandle.current().pid());
        admin.start();
        int queues = 4;
        String master = null;
        for (int i = 2; i < args.length; i++) {
            String op = args[i];
            int colon = op.indexOf(':');
            if (colon < 0) throw new IllegalArgumentException("bad op " + op);
            String kind = op.substring(0, colon);
            String arg = op.substring(colon + 1);
            switch (kind) {
                case "wait": { // wait:SECONDS or wait:SECONDS@BROKER_ADDR (nudge that broker)
                    int at = arg.indexOf('@');
                    String kick = at < 0 ? null : arg.substring(at + 1);
                    master = waitMaster(admin, cluster, Double.parseDouble(at < 0 ? arg : arg.substring(0, at)), kick);
                    System.out.println("broker registered: " + master);
                    break;
                }
                case "queues":
                    queues = Integer.parseInt(arg);
                    break;
                case "topic":
                case "fifo-topic": {
                    if (master == null) master = waitMaster(admin, cluster, 10, null);
                    TopicConfig tc = new TopicConfig(arg, queues, queues, 6);
                    Map<String, String> attrs = new HashMap<>();
                    attrs.put("+message.type", kind.equals("fifo-topic") ? "FIFO" : "NORMAL");
                    tc.setAttributes(attrs);
                    admin.createAndUpdateTopicConfig(master, tc);
                    waitRoute(admin, arg);
                    System.out.println("topic " + arg + " (" + (kind.equals("fifo-topic") ? "FIFO" : "NORMAL")
                        + ", " + queues + " queues) on " + master);
                    break;
                }
                case "group":
                case "fifo-group": {
                    if (master == null) master = waitMaster(admin, cluster, 10, null);
                    SubscriptionGroupConfig sg = new SubscriptionGroupConfig();
                    sg.setGroupName(arg);
                    sg.setConsumeMessageOrderly(kind.equals("fifo-group"));
                    admin.createAndUpdateSubscriptionGroupConfig(master, sg);
                    System.out.println("group " + arg + " (consumeMessageOrderly="
                        + kind.equals("fifo-group") + ") on " + master);
                    break;
                }
                default:
                    throw new IllegalArgumentException("bad op " + op);
            }
        }
        return 0;
    }
}
