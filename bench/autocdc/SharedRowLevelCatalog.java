// The Auto CDC target of bench/bench_autocdc.py (built by it with javac; not part of the product).
//
// Spark's own in-memory table with row-level operations (MERGE), from the spark-catalyst tests
// jar on Maven Central, keeps its tables in its catalog instance, and Spark makes one catalog
// instance per session. A streaming query runs its micro-batches in a clone of the session, so
// Auto CDC's MERGE would look for the target (and its auxiliary state table) in an empty
// catalog. The only change here: every instance shares one table and one namespace map, so the
// pipeline's sessions, its streaming clones and the bench's reader see the same tables.
package bench.autocdc;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.InMemoryRowLevelOperationTableCatalog;
import org.apache.spark.sql.connector.catalog.Table;

public class SharedRowLevelCatalog extends InMemoryRowLevelOperationTableCatalog {
  private static final Map<Identifier, Table> TABLES = new ConcurrentHashMap<>();
  private static final Map<
          scala.collection.immutable.List<String>, scala.collection.immutable.Map<String, String>>
      NAMESPACES = new ConcurrentHashMap<>();

  @Override
  public Map<Identifier, Table> tables() {
    return TABLES;
  }

  @Override
  public Map<scala.collection.immutable.List<String>, scala.collection.immutable.Map<String, String>>
      namespaces() {
    return NAMESPACES;
  }
}
