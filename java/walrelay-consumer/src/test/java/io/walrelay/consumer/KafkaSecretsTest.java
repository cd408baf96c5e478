package io.walrelay.consumer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class KafkaSecretsTest {
    private static final String SECRET = "s3cret-never-shown";

    @Test
    void theSecretPropertiesAreTheRelaysAndTheJvmClientsJaasConfig() {
        for (String name : List.of("sasl.jaas.config", "sasl.password", "ssl.key.password", "ssl.keystore.password",
                "ssl.truststore.password", "ssl.keystore.key", "sasl.oauthbearer.client.credentials.client.secret",
                "sasl.oauthbearer.assertion.private.key.passphrase", "ssl.key.pem", "SASL.JAAS.CONFIG")) {
            assertTrue(KafkaSecrets.isSecret(name), name);
        }
        for (String name : List.of("sasl.mechanism", "sasl.login.callback.handler.class",
                "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.scope",
                "sasl.oauthbearer.client.credentials.client.id", "bootstrap.servers", "ssl.truststore.location")) {
            assertFalse(KafkaSecrets.isSecret(name), name);
        }
    }

    @Test
    void referencesResolveFromTheEnvironmentAndFiles(@TempDir Path dir) throws Exception {
        Path file = dir.resolve("secret");
        Files.writeString(file, SECRET + "\n");
        Map<String, Object> config = new LinkedHashMap<>();
        config.put("sasl.oauthbearer.client.credentials.client.secret", "env:KAFKA_CLIENT_SECRET");
        config.put("ssl.key.password", "file:" + file);
        config.put("ssl.keystore.password", "literal:file:not-a-reference");
        config.put("sasl.password", "plain");
        config.put("client.id", "env:KAFKA_CLIENT_SECRET"); // not a secret property: as written
        config.put("max.poll.records", 100);
        Map<String, Object> resolved = KafkaSecrets.resolve(config, Map.of("KAFKA_CLIENT_SECRET", SECRET)::get);
        assertEquals(SECRET, resolved.get("sasl.oauthbearer.client.credentials.client.secret"));
        assertEquals(SECRET, resolved.get("ssl.key.password"));
        assertEquals("file:not-a-reference", resolved.get("ssl.keystore.password"));
        assertEquals("plain", resolved.get("sasl.password"));
        assertEquals("env:KAFKA_CLIENT_SECRET", resolved.get("client.id"));
        assertEquals(100, resolved.get("max.poll.records"));
        assertEquals("file:" + file, config.get("ssl.key.password"), "the input is not changed");
        Files.writeString(file, SECRET + "\r\n");
        assertEquals(SECRET, KafkaSecrets.resolveValue("ssl.key.password", "file:" + file, n -> null));
    }

    @Test
    void aWholeJaasConfigComesFromTheEnvironment() {
        String jaas = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                + "clientId=\"orders\" clientSecret=\"" + SECRET + "\" scope=\"kafka\";";
        Map<String, Object> resolved = KafkaSecrets.resolve(Map.of("sasl.jaas.config", "env:KAFKA_JAAS_CONFIG"),
                Map.of("KAFKA_JAAS_CONFIG", jaas)::get);
        assertEquals(jaas, resolved.get("sasl.jaas.config"));
    }

    @Test
    void anUnresolvableReferenceNamesThePropertyAndWhereItLooked(@TempDir Path dir) throws Exception {
        Path empty = Files.writeString(dir.resolve("empty"), "\n");
        Map<String, String> cases = Map.of(
                "env:MISSING", "environment variable MISSING is not set",
                "env:", "does not name an environment variable",
                "env:EMPTY", "environment variable EMPTY is empty",
                "file:", "names no file",
                "file:/nonexistent/secret", "file /nonexistent/secret does not exist",
                "file:" + empty, "file " + empty + " is empty");
        cases.forEach((value, words) -> {
            SecretException e = assertThrows(SecretException.class,
                    () -> KafkaSecrets.resolve(Map.of("sasl.jaas.config", value), Map.of("EMPTY", "")::get));
            assertEquals("sasl.jaas.config", e.property());
            assertTrue(e.getMessage().startsWith("the Kafka property sasl.jaas.config: "), e.getMessage());
            assertTrue(e.getMessage().contains(words), e.getMessage());
        });
    }

    @Test
    void redactedHidesEverySecretValue() {
        Map<String, Object> config = new LinkedHashMap<>();
        config.put("sasl.jaas.config", "... clientSecret=\"" + SECRET + "\";");
        config.put("sasl.oauthbearer.client.credentials.client.secret", "env:X");
        config.put("sasl.mechanism", "OAUTHBEARER");
        assertEquals(Map.of("sasl.jaas.config", KafkaSecrets.REDACTED,
                "sasl.oauthbearer.client.credentials.client.secret", KafkaSecrets.REDACTED,
                "sasl.mechanism", "OAUTHBEARER"), KafkaSecrets.redacted(config));
    }
}
