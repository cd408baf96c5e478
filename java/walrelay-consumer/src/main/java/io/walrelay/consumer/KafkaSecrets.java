package io.walrelay.consumer;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.function.Function;

/**
 * Secrets in a Kafka client configuration: which properties hold one,
 * references to where a secret is kept instead of the secret itself, and a
 * copy of a configuration that is safe to log.
 *
 * <p>A property holds a secret when its name contains {@code password},
 * {@code secret}, {@code passphrase} or {@code jaas}, ends with
 * {@code key.pem}, or is {@code ssl.keystore.key}, {@code ssl_key} or
 * {@code sasl.oauthbearer.config}: the relay's rule, plus the JVM client's
 * {@code sasl.jaas.config} (which carries an OAuth client secret or a
 * password) and {@code ssl.keystore.key}. The value of a secret property may
 * be a reference:
 *
 * <table>
 * <caption>What a secret property's value resolves to</caption>
 * <tr><th>value</th><th>resolves to</th></tr>
 * <tr><td>{@code env:NAME}</td><td>the value of environment variable {@code NAME}</td></tr>
 * <tr><td>{@code file:/path/to/file}</td><td>the file's contents, without one trailing newline</td></tr>
 * <tr><td>{@code literal:text}</td><td>{@code text} as written (a secret that starts with {@code env:},
 *     {@code file:} or {@code literal:})</td></tr>
 * <tr><td>anything else</td><td>itself</td></tr>
 * </table>
 *
 * <p>{@link ConsumerLoop} does not resolve references itself: a service
 * calls {@link #resolve(Map)} on the configuration it builds (the example
 * services do it for their {@code --kafka} properties), so a secret never has
 * to be written on a command line. Errors ({@link SecretException}) name the
 * property and the variable or file, never a value.
 */
public final class KafkaSecrets {
    /** What a secret's value is shown as. */
    public static final String REDACTED = "<redacted>";

    private KafkaSecrets() {}

    /** Whether the Kafka property {@code name} holds a secret. */
    public static boolean isSecret(String name) {
        String n = name.toLowerCase(Locale.ROOT);
        return n.contains("password") || n.contains("secret") || n.contains("passphrase") || n.contains("jaas")
                || n.endsWith("key.pem") || n.equals("ssl.keystore.key") || n.equals("ssl_key")
                || n.equals("sasl.oauthbearer.config");
    }

    /**
     * A copy of {@code config} with the references of its secret properties
     * resolved from the process's environment and files; other properties,
     * and values that are not strings, are left as they are. The result holds
     * secrets in clear text: give it to the loop, never to a log
     * ({@link #redacted}).
     *
     * @throws SecretException a reference that cannot be resolved
     */
    public static Map<String, Object> resolve(Map<String, ?> config) {
        return resolve(config, System::getenv);
    }

    /** {@link #resolve(Map)} with {@code environment} instead of the process's environment. */
    public static Map<String, Object> resolve(Map<String, ?> config, Function<String, String> environment) {
        Map<String, Object> resolved = new LinkedHashMap<>();
        config.forEach((name, value) -> resolved.put(name,
                value instanceof String s && isSecret(name) ? resolveValue(name, s, environment) : value));
        return resolved;
    }

    /**
     * The secret that {@code value}, the value of the secret property
     * {@code name}, stands for (see the class).
     *
     * @throws SecretException a reference that cannot be resolved
     */
    public static String resolveValue(String name, String value, Function<String, String> environment) {
        if (value.startsWith("literal:")) {
            return value.substring("literal:".length());
        }
        if (value.startsWith("env:")) {
            String variable = value.substring("env:".length());
            if (variable.isEmpty() || variable.indexOf('=') >= 0 || variable.indexOf('\0') >= 0) {
                throw new SecretException(name, "`env:" + variable
                        + "` does not name an environment variable (write `env:NAME`)");
            }
            String secret = environment.apply(variable);
            if (secret == null) {
                throw new SecretException(name, "environment variable " + variable + " is not set");
            }
            return notEmpty(name, secret, "environment variable " + variable);
        }
        if (value.startsWith("file:")) {
            String path = value.substring("file:".length());
            if (path.isEmpty()) {
                throw new SecretException(name, "`file:` names no file (write `file:/path/to/secret`)");
            }
            return notEmpty(name, readSecretFile(name, path), "file " + path);
        }
        return value;
    }

    /** A file's text without one trailing newline (which {@code echo} and most editors add). */
    private static String readSecretFile(String name, String path) {
        String text;
        try {
            text = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(Files.readAllBytes(Path.of(path)))).toString();
        } catch (CharacterCodingException e) {
            throw new SecretException(name, "file " + path + " is not valid UTF-8");
        } catch (NoSuchFileException e) {
            throw new SecretException(name, "file " + path + " does not exist");
        } catch (AccessDeniedException e) {
            throw new SecretException(name, "file " + path + " cannot be read: permission denied");
        } catch (IOException | RuntimeException e) {
            throw new SecretException(name, "file " + path + " cannot be read: " + e.getClass().getSimpleName());
        }
        if (text.endsWith("\n")) {
            text = text.substring(0, text.length() - 1);
            if (text.endsWith("\r")) {
                text = text.substring(0, text.length() - 1);
            }
        }
        return text;
    }

    private static String notEmpty(String name, String secret, String origin) {
        if (secret.isEmpty()) {
            throw new SecretException(name, origin + " is empty");
        }
        return secret;
    }

    /**
     * A copy of {@code config} to log or show: every secret property's value
     * replaced by {@link #REDACTED} (references too, since a resolved secret
     * may itself look like one).
     */
    public static Map<String, Object> redacted(Map<String, ?> config) {
        Map<String, Object> shown = new LinkedHashMap<>();
        config.forEach((name, value) -> shown.put(name, isSecret(name) ? REDACTED : value));
        return shown;
    }
}
