// The cluster operations the fault tests need that librdkafka's admin API
// lacks: which node leads the KRaft quorum (the active controller), which
// broker coordinates a consumer group, a partition reassignment and a
// preferred-leader election. Kafka's own Admin client, run by `java` as a
// single source file against the installed Kafka's jars (no build step):
//
//   java -cp 'KAFKA/libs/*' ClusterAdmin.java BOOTSTRAP quorum-leader
//   java -cp 'KAFKA/libs/*' ClusterAdmin.java BOOTSTRAP coordinator GROUP
//   java -cp 'KAFKA/libs/*' ClusterAdmin.java BOOTSTRAP reassign TOPIC PARTITION 2,3,1
//   java -cp 'KAFKA/libs/*' ClusterAdmin.java BOOTSTRAP elect-preferred TOPIC PARTITION
//   java -cp 'KAFKA/libs/*' ClusterAdmin.java BOOTSTRAP set-topic-config TOPIC NAME VALUE
//
// Prints one line, `ok <value>`, and exits 0; on failure the exception on
// stderr and exit 1. `reassign` returns once the reassignment completed.

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;

public final class ClusterAdmin {
    private static final long TIMEOUT_S = 60;

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: ClusterAdmin BOOTSTRAP COMMAND [ARGS]");
            System.exit(64);
        }
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            String value = switch (args[1]) {
                case "quorum-leader" -> String.valueOf(
                    admin.describeMetadataQuorum().quorumInfo().get(TIMEOUT_S, TimeUnit.SECONDS).leaderId());
                case "coordinator" -> String.valueOf(
                    admin.describeConsumerGroups(List.of(args[2])).describedGroups().get(args[2])
                        .get(TIMEOUT_S, TimeUnit.SECONDS).coordinator().id());
                case "reassign" -> reassign(admin, new TopicPartition(args[2], Integer.parseInt(args[3])),
                    Arrays.stream(args[4].split(",")).map(Integer::valueOf).collect(Collectors.toList()));
                case "elect-preferred" -> {
                    TopicPartition tp = new TopicPartition(args[2], Integer.parseInt(args[3]));
                    Map<TopicPartition, Optional<Throwable>> result = admin
                        .electLeaders(ElectionType.PREFERRED, Set.of(tp)).partitions()
                        .get(TIMEOUT_S, TimeUnit.SECONDS);
                    // "Election not needed" (the preferred replica leads
                    // already) is success here.
                    yield result.get(tp).map(t -> t.getClass().getSimpleName()).orElse("elected");
                }
                case "set-topic-config" -> {
                    ConfigResource topic = new ConfigResource(ConfigResource.Type.TOPIC, args[2]);
                    admin.incrementalAlterConfigs(Map.of(topic, List.of(new AlterConfigOp(
                            new ConfigEntry(args[3], args[4]), AlterConfigOp.OpType.SET))))
                        .all().get(TIMEOUT_S, TimeUnit.SECONDS);
                    yield args[3] + "=" + args[4];
                }
                default -> throw new IllegalArgumentException("unknown command " + args[1]);
            };
            System.out.println("ok " + value);
        }
    }

    private static String reassign(Admin admin, TopicPartition tp, List<Integer> replicas) throws Exception {
        admin.alterPartitionReassignments(Map.of(tp, Optional.of(new NewPartitionReassignment(replicas))))
            .all().get(TIMEOUT_S, TimeUnit.SECONDS);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(TIMEOUT_S);
        while (admin.listPartitionReassignments(Set.of(tp)).reassignments()
                .get(TIMEOUT_S, TimeUnit.SECONDS).containsKey(tp)) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("the reassignment of " + tp + " did not complete in " + TIMEOUT_S + " s");
            }
            Thread.sleep(100);
        }
        return replicas.toString().replace(" ", "");
    }
}
